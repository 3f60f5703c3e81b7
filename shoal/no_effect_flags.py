"""tritonserver flags that ``shoal serve`` takes so that a Triton command line starts shoal,
but that change nothing in shoal: each one given is named in a warning at start."""

from __future__ import annotations

import argparse
from typing import Final

from shoal.configs.flags.common import dest

_EVENT_LOOP = "shoal's frontends are event loops (--frontend-processes adds processes)"
_NO_GPU_POOLS = "shoal keeps no pinned or CUDA memory pools"
# tritonserver flags taken so that a Triton command line starts shoal, which they do not
# change: flag -> (repeatable, why). Each one given is named in a warning at start.
NO_EFFECT_FLAGS: Final[dict[str, tuple[bool, str]]] = {
    "--http-thread-count": (False, _EVENT_LOOP),
    "--grpc-infer-thread-count": (False, _EVENT_LOOP),
    "--model-load-thread-count": (False, "each instance loads in its own process, all at once"),
    "--backend-directory": (False, "shoal's backends are built in"),
    "--repoagent-directory": (False, "shoal has no repository agents"),
    "--cache-directory": (False, "shoal's one cache, local, is built in"),
    "--pinned-memory-pool-byte-size": (False, _NO_GPU_POOLS),
    "--cuda-memory-pool-byte-size": (True, _NO_GPU_POOLS),
    "--buffer-manager-thread-count": (False, _NO_GPU_POOLS),
    "--host-policy": (True, "instances are placed by their instance groups"),
    "--enable-peer-access": (False, "GPU instances see their own GPU only"),
    "--min-supported-compute-capability": (False, "every GPU the driver lists is used"),
    "--model-load-gpu-limit": (True, "GPU memory is not budgeted per load"),
    "--http-header-forward-pattern": (False, "no backend of shoal's reads request headers"),
    "--grpc-header-forward-pattern": (False, "no backend of shoal's reads request headers"),
    "--grpc-infer-response-compression-level": (False, "responses are not compressed"),
    "--grpc-infer-allocation-pool-size": (False, _EVENT_LOOP),
    "--grpc-max-response-pool-size": (False, "a stream's responses are not pooled"),
    "--cuda-virtual-address-size": (True, _NO_GPU_POOLS),
}


def add_no_effect_flags(p: argparse.ArgumentParser) -> None:
    for flag, (repeatable, _) in NO_EFFECT_FLAGS.items():
        p.add_argument(
            flag, action="append" if repeatable else "store", default=None, help=argparse.SUPPRESS
        )


def no_effect(args: argparse.Namespace) -> list[str]:
    """A line for each flag of NO_EFFECT_FLAGS that ``args`` gives."""
    out = []
    for flag, (_, why) in NO_EFFECT_FLAGS.items():
        value = getattr(args, dest(flag))
        if value is not None:
            shown = ",".join(value) if isinstance(value, list) else value
            out.append(f"{flag}={shown} has no effect: {why}")
    return out


def check_values(args: argparse.Namespace) -> str | None:
    """Why a value of these flags is refused, as tritonserver refuses it (its server
    options check them even where shoal then makes no use of them); None: all taken."""
    pool = getattr(args, dest("--grpc-max-response-pool-size"))
    if pool is not None and not (pool.lstrip("-").isdigit() and int(pool) > 0):
        return "Error: --grpc-max-response-pool-size must be greater than 0."
    for limit in getattr(args, dest("--model-load-gpu-limit")) or []:
        device, sep, fraction = limit.partition(":")
        try:
            device_id, share = int(device), float(fraction)
        except ValueError:
            device_id, share = -1, -1.0
            sep = ""
        if not sep:
            return (
                'Bad option: "--model-load-gpu-limit". Cannot parse pair option due to '
                "incorrect number of inputs.--<pair option> argument requires format "
                f"<first>:<second>. Found: {limit}"
            )
        if device_id < 0:
            return f"creating server: Invalid argument - expects device ID >= 0, got {device_id}"
        if not 0.0 <= share <= 1.0:
            return (
                "creating server: Invalid argument - expects limit fraction to be in range "
                f"[0.0, 1.0], got {share:f}"
            )
    return None
