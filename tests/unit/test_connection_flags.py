"""The flags that bound connections and slow clients: ``shoal serve`` passes what it was
given to each frontend, which fills in the defaults (gRPC's as grpcio options)."""

from __future__ import annotations

import argparse

import pytest

from shoal.configs.flags.frontend import (
    GRPC_OPTION_DEFAULTS,
    add_connection_flags,
    add_grpc_flags,
    connection_flag_values,
    grpc_flag_values,
    grpc_options,
)
from shoal.frontend.__main__ import parse_args


def _serve_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_grpc_flags(p)
    add_connection_flags(p)
    return p.parse_args(list(argv))


def test_a_frontend_gets_the_flags_given_and_defaults_for_the_rest() -> None:
    given = _serve_args("--http-header-timeout-secs=2.5", "--http-max-connections=64")
    front = parse_args(["--runtime-dir=/tmp/x", *connection_flag_values(given)])
    assert front.http_header_timeout_secs == 2.5
    assert front.http_max_connections == 64
    assert front.grpc_max_connections is None  # the frontend sizes it from its limit
    assert (front.http_keepalive_timeout_secs, front.http_body_timeout_secs) == (75.0, 30.0)
    assert front.http_body_min_rate == 8192


def test_grpc_defaults_free_stuck_connections_and_a_flag_overrides_them() -> None:
    options = dict(grpc_options(_serve_args()))
    assert options == {
        "grpc.keepalive_time_ms": 60_000,
        "grpc.keepalive_timeout_ms": 20_000,
        "grpc.max_connection_age_ms": 3_600_000,
        "grpc.max_connection_age_grace_ms": 600_000,
        "grpc.max_concurrent_streams": 1024,
        "grpc.server_handshake_timeout_ms": 10_000,
    }
    assert len(options) == len(GRPC_OPTION_DEFAULTS)
    given = _serve_args("--grpc-keepalive-time=7200000", "--grpc-max-concurrent-streams=8")
    options = dict(grpc_options(given))
    assert options["grpc.keepalive_time_ms"] == 7_200_000
    assert options["grpc.max_concurrent_streams"] == 8
    # only what was given travels to a frontend (which applies the same defaults)
    assert [f for f in grpc_flag_values(given) if "ssl" not in f] == [
        "--grpc-keepalive-time=7200000",
        "--grpc-max-concurrent-streams=8",
    ]


@pytest.mark.parametrize(
    "flag",
    [
        "--http-header-timeout-secs=0",
        "--http-keepalive-timeout-secs=-1",
        "--http-body-timeout-secs=x",
        "--http-max-connections=-1",
        "--http-body-min-rate=fast",
    ],
)
def test_a_bad_value_is_refused(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _serve_args(flag)
    assert flag.partition("=")[0] in capsys.readouterr().err
