"""The server's trace settings (shoal/configs/trace_settings.py): global and per model,
with Triton's fallbacks and its refusal of a setting that would trace nothing."""

from __future__ import annotations

import pytest

from shoal.configs.trace_settings import TraceSettings
from shoal.ipc.errors import ServingError
from shoal.ipc.messages import TraceSetting

FLAGS = TraceSetting(levels=("TIMESTAMPS",), rate=1000, file="/t.json")


def test_a_model_follows_the_global_setting_in_what_it_does_not_set() -> None:
    t = TraceSettings(FLAGS, "triton", {})
    t.update("m", {"rate": 2})
    t.update("", {"count": 5, "rate": 10})
    assert t.get("m") == TraceSetting(levels=("TIMESTAMPS",), rate=2, count=5, file="/t.json")
    assert t.get("other") == t.get() == TraceSetting(("TIMESTAMPS",), 10, 5, 0, "/t.json")
    assert set(t.table().models) == {"m"}


def test_clearing_falls_back_and_a_model_with_nothing_set_is_forgotten() -> None:
    t = TraceSettings(FLAGS, "triton", {})
    t.update("", {"rate": 10})
    t.update("m", {"rate": 2})
    t.update("m", {"rate": None})
    assert t.get("m").rate == 10 and t.table().models == {}
    t.update("", {"rate": None})
    assert t.get().rate == 1000


@pytest.mark.parametrize(
    ("mode", "flags", "changes", "reason"),
    [
        ("triton", FLAGS, {"rate": 0}, "sample rate must be non-zero"),
        ("triton", TraceSetting(), {"levels": ["TIMESTAMPS"]}, "trace file name is not given"),
    ],
)
def test_a_setting_that_would_trace_nothing_is_refused(
    mode: str, flags: TraceSetting, changes: dict[str, object], reason: str
) -> None:
    t = TraceSettings(flags, mode, {})
    with pytest.raises(ServingError) as err:
        t.update("", changes)  # type: ignore[arg-type]
    assert err.value.message == f"Attempting to set invalid trace setting :{reason}"
    assert t.get() == flags  # unchanged


def test_turning_tracing_off_is_always_taken() -> None:
    t = TraceSettings(TraceSetting(), "triton", {})
    assert t.update("", {"levels": [], "rate": 0}).rate == 0
    assert TraceSettings(TraceSetting(), "opentelemetry", {}).update(
        "", {"levels": ["TIMESTAMPS"]}
    ).levels == ("TIMESTAMPS",)
