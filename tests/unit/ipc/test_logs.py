"""A role's logging under the log settings: severities gated, DEBUG with verbose, the
two time formats."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import pytest

from shoal.ipc import logs
from shoal.ipc.messages import LogSettings


@pytest.fixture
def root() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logs.current())
    yield root
    logs.apply(saved[2])
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


def test_settings_gate_severities_and_choose_the_format(
    root: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.setup_logging("role", LogSettings(info=False))
    log = logging.getLogger("shoal.test")
    log.debug("d1")
    log.info("i1")
    log.warning("w1")
    err = capsys.readouterr().err
    assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3} role\[\d+\] W shoal\.test: w1\n", err), err
    logs.apply(LogSettings(verbose=1, error=False, format="ISO8601"))
    assert logs.current().verbose == 1
    log.debug("d2")
    log.error("e2")
    log.info("i2")
    err = capsys.readouterr().err
    assert "e2" not in err and "d2" in err and "i2" in err
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ role\[\d+\] D shoal\.test: d2", err), err
