"""tritonserver's trace flags (shoal/configs/flags/trace.py): values, overrides and
Triton's messages for bad ones."""

from __future__ import annotations

import argparse

import pytest

from shoal.configs.flags.trace import add_trace_flags, stoi, trace_flags, trace_settings
from shoal.ipc.messages import TraceSetting


def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_trace_flags(p)
    return p.parse_args(list(argv))


def test_no_flags_trace_nothing() -> None:
    t = trace_settings(_parse())
    assert (t.get(), t.mode, t.options) == (TraceSetting(), "triton", {})


def test_trace_config_overrides_the_deprecated_flags() -> None:
    args = _parse(
        "--trace-file=/old", "--trace-rate=5", "--trace-level=TIMESTAMPS",
        "--trace-config=triton,file=/new", "--trace-config=rate=7",
        "--trace-config=level=TENSORS", "--trace-config=count=3",
        "--trace-config=triton,log-frequency=2",
    )  # fmt: skip
    assert trace_settings(args).get() == TraceSetting(
        levels=("TIMESTAMPS", "TENSORS"), rate=7, count=3, log_frequency=2, file="/new"
    )
    assert trace_flags(args)[0] == "--trace-config=triton,file=/new"


def test_an_off_level_anywhere_turns_tracing_off() -> None:
    args = _parse("--trace-level=TIMESTAMPS", "--trace-config=level=off")
    assert trace_settings(args).get().levels == ()


def test_opentelemetry_takes_its_options_and_the_processor_defaults() -> None:
    args = _parse(
        "--trace-config=mode=opentelemetry", "--trace-config=opentelemetry,url=h:1/v1/traces",
        "--trace-config=opentelemetry,resource=a=b", "--trace-config=opentelemetry,resource=c=d",
        "--trace-config=opentelemetry,bsp_schedule_delay=10", "--trace-file=/ignored",
        "--trace-config=opentelemetry,hop_spans=ON",
    )  # fmt: skip
    t = trace_settings(args)
    assert t.mode == "opentelemetry" and t.get().file == ""
    assert t.options == {
        "url": "h:1/v1/traces",
        "resource": "a=b,c=d",
        "bsp_schedule_delay": "10",
        "bsp_max_queue_size": "2048",
        "bsp_max_export_batch_size": "512",
        "hop_spans": "true",  # (shoal's own, as true or false)
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trace-rate=x"], 'Bad option: "--trace-rate".\nInvalid option value. Got x'),
        (["--trace-level=loud"], "invalid value for trace level option: loud"),
        (["--trace-config=rate=9999999999"], "Provided option value is out of bound."),
        (["--trace-config=,rate=1"], "No trace mode specified."),
        (["--trace-config=zipkin,url=x"], "invalid value for trace mode option: zipkin."),
        (["--trace-config=rate"], "--trace-config option format is"),
        (["--trace-config=rate="], "--trace-config option format is"),
        (["--trace-config=triton,log-frequency=z"], 'Bad option: "--trace-config triton,log'),
        (["--trace-config=mode=x"], 'Bad option: "--trace-config mode".'),
        (
            ["--trace-config=mode=opentelemetry", "--trace-config=opentelemetry,hop_spans=yes"],
            'Bad option: "--trace-config opentelemetry,hop_spans".\nInvalid option value. Got yes',
        ),
    ],
)
def test_bad_values_are_refused_in_tritons_words(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError) as err:
        trace_settings(_parse(*argv))
    assert message in str(err.value)


def test_stoi_reads_a_leading_integer_as_cpp_does() -> None:
    assert stoi(" 12abc") == 12
    assert stoi("-3") == -3
    for bad in ("abc", "", "+"):
        with pytest.raises(ValueError, match="invalid"):
            stoi(bad)
    with pytest.raises(ValueError, match="range"):
        stoi(str(2**31))
