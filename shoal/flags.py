"""Flag value parsers shared by every role's command line (tritonserver's spellings)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Final

from ipc.messages import LOG_FORMATS, LogSettings

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def bool_flag(value: str) -> bool:
    """tritonserver booleans: true/false/1/0 (case-insensitive)."""
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false/1/0), got '{value}'")


@dataclass(frozen=True)
class MetricsConfig:
    """tritonserver's ``--metrics-config key=value`` settings."""

    counter_latencies: bool = True
    summary_latencies: bool = False
    # Triton's histogram is of the first response of decoupled models, which shoal does
    # not serve: accepted, nothing to show (as Triton shows nothing for other models).
    histogram_latencies: bool = False
    # quantile -> allowed error (Triton's form "0.5:0.05,0.9:0.01"); shoal's are exact
    summary_quantiles: tuple[tuple[float, float], ...] = (
        (0.5, 0.05),
        (0.9, 0.01),
        (0.95, 0.001),
        (0.99, 0.001),
        (0.999, 0.0001),
    )


def add_log_flags(p: argparse.ArgumentParser) -> None:
    """tritonserver's logging flags, for ``shoal serve`` and each role process."""
    p.add_argument("--log-verbose", default=0, type=int)
    p.add_argument("--log-info", type=bool_flag, default=True)
    p.add_argument("--log-warning", type=bool_flag, default=True)
    p.add_argument("--log-error", type=bool_flag, default=True)
    p.add_argument("--log-format", choices=LOG_FORMATS, default="default")


def log_settings(args: argparse.Namespace) -> LogSettings:
    return LogSettings(
        args.log_info, args.log_warning, args.log_error, max(args.log_verbose, 0), args.log_format
    )


def log_flags(s: LogSettings) -> list[str]:
    """The flags that give a role process these settings."""
    return [
        f"--log-verbose={s.verbose}",
        f"--log-info={str(s.info).lower()}",
        f"--log-warning={str(s.warning).lower()}",
        f"--log-error={str(s.error).lower()}",
        f"--log-format={s.format}",
    ]


RESTRICTED_GROUPS: Final = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)
RestrictionRule = tuple[str, str]  # (header key, value)
Restrictions = dict[str, RestrictionRule]  # group -> the header it asks for


def restrictions(values: list[str], flag: str) -> Restrictions:
    """Every ``<apis>:<key>=<value>`` of one flag; ValueError says what is wrong (as
    Triton, an API may be in one group only)."""
    rules: Restrictions = {}
    for v in values:
        apis, sep, header = v.partition(":")  # a value may hold ":" and "="
        key, eq, value = header.partition("=")
        if not sep or not apis or not eq or not key.strip():
            raise ValueError(f"{flag}: expected '<apis>:<key>=<value>', got '{v}'")
        for api in (a.strip() for a in apis.split(",")):
            if api not in RESTRICTED_GROUPS:
                kind = "api" if flag.startswith("--http") else "protocol"
                raise ValueError(f"unknown restricted {kind} '{api}'")
            if api in rules:
                raise ValueError(
                    f"restricted api '{api}' can not be specified in multiple config groups"
                )
            rules[api] = (key.strip(), value)
    return rules


def add_restriction_flags(p: argparse.ArgumentParser) -> None:
    """tritonserver's restricted API groups, for ``shoal serve`` and each frontend."""
    for flag in ("--http-restricted-api", "--grpc-restricted-protocol"):
        p.add_argument(flag, action="append", default=[], metavar="APIS:KEY=VALUE")


def add_metrics_flags(p: argparse.ArgumentParser) -> None:
    """tritonserver's metrics flags, for ``shoal serve`` and each frontend process."""
    p.add_argument("--allow-metrics", type=bool_flag, default=True)
    p.add_argument("--metrics-address", default="", help="default: the HTTP address")
    p.add_argument("--metrics-port", default=8002, type=int)
    p.add_argument("--metrics-interval-ms", default=2000, type=int)
    p.add_argument("--allow-cpu-metrics", type=bool_flag, default=True)
    p.add_argument(
        "--allow-gpu-metrics",
        type=bool_flag,
        default=True,
        help="accepted; shoal has no GPU metrics yet",
    )
    p.add_argument(
        "--metrics-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="counter_latencies, summary_latencies, summary_quantiles, histogram_latencies",
    )


def metrics_port_clash(args: argparse.Namespace) -> str | None:
    """Why the metrics listener cannot be where the flags put it, or None. On the HTTP or
    gRPC port of an overlapping address it would bind beside that listener (several
    frontends set SO_REUSEPORT) and take part of its connections."""
    if not args.allow_metrics:
        return None
    address = args.metrics_address or args.http_address
    wildcard = {"", "0.0.0.0", "::"}
    for name, on, port, addr in (
        ("HTTP", args.allow_http, args.http_port, args.http_address),
        ("gRPC", args.allow_grpc, args.grpc_port, args.grpc_address),
    ):
        overlap = address == addr or address in wildcard or addr in wildcard
        if on and port == args.metrics_port and overlap:
            return f"--metrics-port {port} is also the {name} port"
    return None


def _quantiles(value: str) -> tuple[tuple[float, float], ...]:
    out: list[tuple[float, float]] = []
    for part in value.split(","):
        q, sep, err = part.partition(":")
        try:
            pair = (float(q), float(err))
        except ValueError:
            pair = (-1.0, -1.0)
        if not sep or not (0 <= pair[0] <= 1 and 0 <= pair[1] <= 1):
            raise argparse.ArgumentTypeError(
                f"summary_quantiles: expected 'quantile:error' pairs in [0, 1] separated "
                f"by commas, got '{value}'"
            )
        if any(q == pair[0] for q, _ in out):
            raise argparse.ArgumentTypeError(f"summary_quantiles: quantile {q} given twice")
        out.append(pair)
    return tuple(out)


def metrics_config(values: list[str]) -> MetricsConfig:
    """Every ``--metrics-config`` value, in order (a later one wins); an unknown key or
    a bad value raises ArgumentTypeError."""
    fields: dict[str, object] = {}
    for v in values:
        key, sep, val = v.partition("=")
        key = key.strip()
        if not sep:
            raise argparse.ArgumentTypeError(f"--metrics-config: expected key=value, got '{v}'")
        if key in ("counter_latencies", "summary_latencies", "histogram_latencies"):
            fields[key] = bool_flag(val)
        elif key == "summary_quantiles":
            fields[key] = _quantiles(val)
        else:
            raise argparse.ArgumentTypeError(
                f"--metrics-config: unknown key '{key}' (known: counter_latencies, "
                "summary_latencies, summary_quantiles, histogram_latencies)"
            )
    return MetricsConfig(**fields)  # type: ignore[arg-type]


@dataclass(frozen=True)
class FrontendFlags:
    """What a frontend's flags mean beyond their plain values."""

    metrics: MetricsConfig
    http_restricted: Restrictions
    grpc_restricted: Restrictions


def frontend_flags(args: argparse.Namespace) -> FrontendFlags:
    """The metrics config and restricted groups of ``args`` (``shoal serve``'s or a
    frontend's); ValueError says what is wrong with them."""
    try:
        metrics = metrics_config(args.metrics_config)
    except argparse.ArgumentTypeError as exc:
        raise ValueError(str(exc)) from None
    if clash := metrics_port_clash(args):
        raise ValueError(clash)
    return FrontendFlags(
        metrics,
        restrictions(args.http_restricted_api, "--http-restricted-api"),
        restrictions(args.grpc_restricted_protocol, "--grpc-restricted-protocol"),
    )
