"""A broker over an empty repository, its sockets bound in a private runtime dir."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.broker.proc import BrokerProc
from shoal.broker.startup import BrokerSettings


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProc]:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (tmp_path / "repo").mkdir()
    b = BrokerProc(BrokerSettings(model_repository=tmp_path / "repo", runtime_dir=run))
    yield b
    b.close()
