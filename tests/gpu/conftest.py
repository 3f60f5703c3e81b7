"""The GPU tests skip, saying why, on a host where shoal sees no GPU (``-m gpu`` there
would otherwise start servers whose KIND_GPU models cannot load, and error). On a GPU
host scripts/gpu-tests.sh runs them; its preflight fails first where shoal sees none."""

from __future__ import annotations

import pytest

from shoal.configs.devices import gpu_count


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if gpu_count() > 0:
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU here (shoal.configs.devices sees none)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
