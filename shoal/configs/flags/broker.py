"""The broker's settings (tritonserver's spellings where Triton has them): the rate limiter,
the memory limit on instances, lending cores between instances, and how long a frontend
may stay silent."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Final

from shoal.configs.flags.common import bool_flag, checked, mib_flag


def add_instance_memory_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--instance-memory-limit-mb",
        default=0,
        type=mib_flag,
        help="stop after its batch (and so restart) a model instance holding more memory of "
        "its own (MiB) than this, unless its config sets shoal_instance_memory_limit_mb; "
        "0: no limit",
    )


#: The shortest silence a frontend may be judged stuck after: frontends ping every
#: second or so (shoal/broker/frontend_watch.py), so less would kill healthy ones.
MIN_FRONTEND_SILENCE_S: Final = 2.0


def frontend_silence_flag(value: str) -> float:
    """Seconds, 0 (never) or at least MIN_FRONTEND_SILENCE_S."""
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if number != 0 and not number >= MIN_FRONTEND_SILENCE_S:
        raise argparse.ArgumentTypeError(
            f"expected 0 (never) or at least {MIN_FRONTEND_SILENCE_S:g} seconds, got '{value}'"
        )
    return number


def add_frontend_silence_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--frontend-silence-timeout-secs",
        default=30.0,
        type=frontend_silence_flag,
        help="the broker kills (and so shoal serve or supervisord restarts) a frontend that "
        "has sent it nothing for this long: stuck, its event loop blocked or the process "
        "stopped (0: never)",
    )


def add_cpu_lending_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cpu-lending",
        default=True,
        type=bool_flag,
        help="let busy CPU instances of large models run on the cores of idle instances "
        "(re-pinned as load shifts; each instance keeps its own cores)",
    )


#: --rate-limit's values (shoal/configs/rate_limits.py acts on them)
RATE_LIMIT_MODES: Final = ("off", "execution_count")
#: The device of --rate-limit-resource without one: every device.
EVERY_DEVICE: Final = -1


def parse_rate_limit(value: str) -> str:
    """--rate-limit's value, lower-cased (Triton's is case-insensitive), or ValueError."""
    mode = value.lower()
    if mode not in RATE_LIMIT_MODES:
        raise ValueError("invalid argument for --rate-limit")
    return mode


def _rate_limit_flag(value: str) -> str:
    try:
        return parse_rate_limit(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass(frozen=True)
class GivenResource:
    """One --rate-limit-resource: ``device`` -1 means every device."""

    name: str
    count: int
    device: int = EVERY_DEVICE


def parse_resource(arg: str) -> GivenResource:
    """``<name>:<count>`` or ``<name>:<count>:<device>``, or ValueError with Triton's
    message. Names keep their case, as Triton keeps them."""
    usage = (
        "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
        f"'<resource_name>:<count>'. Got {arg}"
    )
    parts = arg.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(usage)
    try:
        numbers = [int(p) for p in parts[1:]]
    except ValueError:
        raise ValueError(usage) from None
    if numbers[0] < 0 or (len(numbers) == 2 and numbers[1] < -1):
        raise ValueError(f"{usage}: the count must be 0 or more, the device -1 or more")
    return GivenResource(parts[0], *numbers)


def add_rate_limit_flags(p: argparse.ArgumentParser) -> None:
    """tritonserver's rate limiter flags (shoal/configs/rate_limits.py)."""
    p.add_argument(
        "--rate-limit",
        default="off",
        type=_rate_limit_flag,
        help="off, or execution_count: an instance runs a batch only while it holds the "
        "resources its instance group's rate_limiter lists, turns going by priority",
    )
    p.add_argument(
        "--rate-limit-resource",
        action="append",
        default=[],
        type=checked(parse_resource),
        help="<name>:<count>[:<device>]: the copies of a resource (default: the most any "
        "instance needs); repeatable",
    )


def rate_limit_flags(mode: str, resources: list[str]) -> list[str]:
    """The flags that give ``mode`` and ``resources`` to another process."""
    return [f"--rate-limit={mode}", *(f"--rate-limit-resource={r}" for r in resources)]
