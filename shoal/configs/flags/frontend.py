"""A frontend's settings (tritonserver's spellings where Triton has them): metrics, restricted
API groups, the response cache, gRPC channel options and TLS, and the bounds on connections
and slow clients."""

from __future__ import annotations

import argparse
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from shoal.configs.flags.common import bool_flag, count_flag, dest, seconds_flag


def add_cache_flags(p: argparse.ArgumentParser) -> None:
    """tritonserver's response cache flags (see ``cache_bytes``)."""
    p.add_argument(
        "--cache-config",
        action="append",
        default=[],
        help="local,size=<bytes>: the response cache, for models whose config enables it",
    )
    p.add_argument("--response-cache-byte-size", default=None, help=argparse.SUPPRESS)


def cache_bytes(cache_config: list[str], byte_size: str | None) -> int:
    """The response cache's size from --cache-config (``local,size=N``, tritonserver's
    form) or the deprecated --response-cache-byte-size; 0: no cache. ValueError with
    Triton's words for a malformed value; shoal's cache is ``local`` alone."""
    if cache_config and byte_size is not None:
        raise ValueError(
            "Incompatible flags --response-cache-byte-size and --cache-config both "
            "provided. Please provide one or the other."
        )
    if byte_size is not None:
        cache_config = [f"local,size={byte_size}"]
    size = 0
    for value in cache_config:
        name, _, setting = value.partition(",")
        key, eq, number = setting.partition("=")
        if not name:
            raise ValueError(
                "No cache specified. --cache-config option format is "
                f"<cache name>,<setting>=<value>. Got {value}"
            )
        if not eq or not key or not number:
            raise ValueError(
                f"--cache-config option format is '<cache name>,<setting>=<value>'. Got {value}"
            )
        if name != "local":
            raise ValueError(f"--cache-config: shoal has the local cache only, not '{name}'")
        if key != "size":
            raise ValueError(f"--cache-config: the local cache has no setting '{key}' (only size)")
        if not number.isascii() or not number.isdigit():
            raise ValueError(f"--cache-config: size must be a number of bytes, got '{number}'")
        size = int(number)
    return size


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
        if not sep or not apis or not eq or not key.strip() or not value:
            # an empty value would let any request with an empty header through
            raise ValueError(f"{flag} option format is '<config name>:<setting>=<value>'. Got {v}")
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
        help="nv_gpu_* and nv_energy_consumption, through NVML, where there are GPUs",
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
    grpc_options: list[tuple[str, int]]
    grpc_tls: GrpcTls | None


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
        grpc_options(args),
        grpc_tls(args),
    )


def add_connection_flags(p: argparse.ArgumentParser) -> None:
    """shoal's bounds on each frontend process's connections and on slow clients
    (shoal.frontend.http_connections; gRPC's own are in GRPC_OPTION_FLAGS), and the
    HTTP listener's second port (``--openai-port``)."""
    p.add_argument(
        "--openai-port",
        type=count_flag,
        default=None,
        help="a second port for the HTTP service, where clients of Triton's OpenAI "
        "frontend (port 9000) find /v1/... (the HTTP port serves it too; default: none)",
    )
    p.add_argument(
        "--http-max-connections",
        type=count_flag,
        default=None,
        help="the most HTTP connections one frontend process holds (default 10000, less "
        "where the open-file limit leaves less); at the cap the idle ones longest idle "
        "close to make room, else health requests are still answered and others get 503",
    )
    p.add_argument(
        "--grpc-max-connections",
        type=count_flag,
        default=None,
        help="the most gRPC connections one frontend process holds (default 1000, less "
        "where the open-file limit leaves less); beyond it, new ones are closed",
    )
    p.add_argument(
        "--http-header-timeout-secs",
        type=seconds_flag,
        default=10.0,
        help="a connection whose first request's headers have not all arrived this long "
        "after it was accepted is closed",
    )
    p.add_argument(
        "--http-keepalive-timeout-secs",
        type=seconds_flag,
        default=75.0,
        help="a connection idle this long between requests is closed (set it above the "
        "idle timeout of a load balancer in front)",
    )
    p.add_argument(
        "--http-body-timeout-secs",
        type=seconds_flag,
        default=30.0,
        help="a request body with no byte for this long is refused (400), and so is one "
        "not all there this long plus a second per --http-body-min-rate bytes after it began",
    )
    p.add_argument(
        "--http-body-min-rate",
        type=count_flag,
        default=8192,
        help="bytes per second a request body must average beyond its first "
        "--http-body-timeout-secs (0: no rate)",
    )


_CONNECTION_FLAGS: Final = (
    "--openai-port",
    "--http-max-connections",
    "--grpc-max-connections",
    "--http-header-timeout-secs",
    "--http-keepalive-timeout-secs",
    "--http-body-timeout-secs",
    "--http-body-min-rate",
)


def connection_flag_values(args: argparse.Namespace) -> list[str]:
    """The connection flags of ``args``, as flags again (for a frontend's command line)."""
    out = []
    for flag in _CONNECTION_FLAGS:
        value = getattr(args, dest(flag))
        if value is not None:
            out.append(f"{flag}={value}")
    return out


# tritonserver's gRPC channel flags -> grpcio server options (ms, or 0/1), and shoal's
# last two. Unset ones take GRPC_OPTION_DEFAULTS, else grpcio's defaults (Triton's).
GRPC_OPTION_FLAGS: Final[dict[str, str]] = {
    "--grpc-keepalive-time": "grpc.keepalive_time_ms",
    "--grpc-keepalive-timeout": "grpc.keepalive_timeout_ms",
    "--grpc-keepalive-permit-without-calls": "grpc.keepalive_permit_without_calls",
    "--grpc-http2-max-pings-without-data": "grpc.http2.max_pings_without_data",
    "--grpc-http2-min-recv-ping-interval-without-data": (
        "grpc.http2.min_ping_interval_without_data_ms"
    ),
    "--grpc-http2-max-ping-strikes": "grpc.http2.max_ping_strikes",
    "--grpc-max-connection-age": "grpc.max_connection_age_ms",
    "--grpc-max-connection-age-grace": "grpc.max_connection_age_grace_ms",
    "--grpc-max-concurrent-streams": "grpc.max_concurrent_streams",
    "--grpc-handshake-timeout": "grpc.server_handshake_timeout_ms",
}
# shoal's defaults where Triton's let a stuck connection live (about) for ever: a peer
# that stops answering while a call is open is dropped after 60 + 20 s (Triton: 2 h);
# every connection is asked to go after an hour (GOAWAY: new calls open a new one) and
# closed 10 minutes later with whatever it still runs (Triton: never); one that has not
# finished its handshake (the HTTP/2 preface, TLS) in 10 s is closed (grpcio: 120 s);
# and a connection runs at most 1,024 calls at once (grpcio: no limit).
GRPC_OPTION_DEFAULTS: Final[dict[str, int]] = {
    "--grpc-keepalive-time": 60_000,
    "--grpc-keepalive-timeout": 20_000,
    "--grpc-max-connection-age": 3_600_000,
    "--grpc-max-connection-age-grace": 600_000,
    "--grpc-max-concurrent-streams": 1024,
    "--grpc-handshake-timeout": 10_000,
}


@dataclass(frozen=True)
class GrpcTls:
    """--grpc-use-ssl[-mutual]: the server's key and certificate, and the root
    certificates a client's certificate must chain to (mutual TLS)."""

    key: bytes
    cert: bytes
    root: bytes | None
    mutual: bool


def add_grpc_flags(p: argparse.ArgumentParser) -> None:
    """tritonserver's gRPC channel and TLS flags, for ``shoal serve`` and each frontend."""
    for flag in GRPC_OPTION_FLAGS:
        kind = bool_flag if flag.endswith("without-calls") else int
        p.add_argument(flag, type=kind, default=None)
    p.add_argument("--grpc-use-ssl", type=bool_flag, default=False)
    p.add_argument("--grpc-use-ssl-mutual", type=bool_flag, default=False)
    p.add_argument("--grpc-server-cert", default="")
    p.add_argument("--grpc-server-key", default="")
    p.add_argument("--grpc-root-cert", default="")


def grpc_flag_values(args: argparse.Namespace) -> list[str]:
    """The gRPC flags ``args`` gives, as flags again (for a frontend's command line)."""
    out = []
    for flag in GRPC_OPTION_FLAGS:
        value = getattr(args, dest(flag))
        if value is not None:
            out.append(f"{flag}={str(value).lower()}")
    out += [f"--grpc-use-ssl={str(args.grpc_use_ssl).lower()}"]
    out += [f"--grpc-use-ssl-mutual={str(args.grpc_use_ssl_mutual).lower()}"]
    for flag in ("--grpc-server-cert", "--grpc-server-key", "--grpc-root-cert"):
        value = getattr(args, dest(flag))
        if value:
            out.append(f"{flag}={Path(value).resolve()}")
    return out


def grpc_options(args: argparse.Namespace) -> list[tuple[str, int]]:
    """The grpcio server options of the gRPC flags (or GRPC_OPTION_DEFAULTS)."""
    out = []
    for flag, option in GRPC_OPTION_FLAGS.items():
        value = getattr(args, dest(flag))
        if value is None:
            value = GRPC_OPTION_DEFAULTS.get(flag)
        if value is not None:
            if int(value) < 0:
                raise ValueError(f"{flag} must not be negative")
            out.append((option, int(value)))
    return out


def _check_tls(args: argparse.Namespace) -> None:
    """The key matches the certificate, and each file is PEM that parses: grpc would say
    so only on its own stderr, as a failure to bind."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(args.grpc_server_cert, args.grpc_server_key)
    except (ssl.SSLError, ValueError) as exc:
        raise ValueError(
            f"--grpc-server-cert and --grpc-server-key are not a certificate and its key: {exc}"
        ) from None
    if args.grpc_root_cert:
        try:
            context.load_verify_locations(cafile=args.grpc_root_cert)
        except (ssl.SSLError, ValueError) as exc:
            raise ValueError(f"--grpc-root-cert holds no certificate: {exc}") from None


def grpc_tls(args: argparse.Namespace) -> GrpcTls | None:
    """The TLS material the flags name, read now; ValueError says what is missing."""
    if not (args.grpc_use_ssl or args.grpc_use_ssl_mutual):
        return None
    files: dict[str, bytes] = {}
    for flag in ("--grpc-server-cert", "--grpc-server-key", "--grpc-root-cert"):
        path = getattr(args, dest(flag))
        if not path:
            if flag == "--grpc-root-cert" and not args.grpc_use_ssl_mutual:
                continue
            using = "--grpc-use-ssl-mutual" if args.grpc_use_ssl_mutual else "--grpc-use-ssl"
            raise ValueError(f"{using} needs {flag}")
        try:
            files[flag] = Path(path).read_bytes()
        except OSError as exc:
            raise ValueError(f"{flag}: {exc}") from None
    _check_tls(args)
    return GrpcTls(
        files["--grpc-server-key"],
        files["--grpc-server-cert"],
        files.get("--grpc-root-cert"),
        args.grpc_use_ssl_mutual,
    )
