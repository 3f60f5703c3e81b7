"""A model's traffic policy between its versions: shoal's extension of ``config.pbtxt``.

Two ``parameters`` entries, which Triton's core and its backends never read (a Triton server
loads the same config and ignores them):

- ``shoal_version_weights``: ``"1:90,2:10"``. A request that names no version goes to one
  of these versions, in proportion to its weight (docs/version-traffic.md). A version not
  listed gets none of that traffic, but still answers requests that name it.
- ``shoal_shadow``: ``"3:5"``. Besides its answer from the version chosen, 5 % of the
  requests that name no version are sent again to version 3, whose answers are dropped:
  they are only counted (its statistics and metrics). The percentage may have decimals.

The weights and the share are checked at load: a bad value fails the model's load with a
message naming it, as Triton fails a load on a bad ``parameters`` value of its backends.

Pure: reads a config's ``parameters``, opens nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

from shoal.configs.backend_params import ParamSource, parameters
from shoal.configs.schema import ConfigError

VERSION_WEIGHTS: Final = "shoal_version_weights"
SHADOW: Final = "shoal_shadow"
#: The request parameter (HTTP JSON ``parameters``, gRPC ``parameters``) whose value keeps a
#: client on one version: the same key always gets the same version while the weights and
#: the ready versions stay the same, across restarts.
ROUTE_KEY: Final = "shoal_route_key"
#: The same key as an HTTP header or gRPC metadata (for a gateway that adds it); the
#: parameter wins when a request carries both.
ROUTE_KEY_HEADER: Final = "shoal-route-key"


@dataclass(frozen=True, slots=True)
class TrafficPolicy:
    """``weights``: version -> positive weight (empty: the latest ready version takes the
    traffic, as Triton routes it). ``shadow``: the version mirrored to, 0 for none;
    ``shadow_ppm``: the share of requests mirrored, in parts per million (1 to 10**6)."""

    weights: tuple[tuple[int, int], ...] = ()
    shadow: int = 0
    shadow_ppm: int = 0
    routed: frozenset[int] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "routed", frozenset(v for v, _ in self.weights))

    @property
    def active(self) -> bool:
        return bool(self.weights or self.shadow)


NO_POLICY: Final = TrafficPolicy()


def _string(config: ParamSource, key: str) -> str | None:
    value = parameters(config).get(key)
    return None if value is None else value.strip()


def _pair(text: str, what: str, name: str) -> tuple[int, float]:
    version, sep, value = text.partition(":")
    try:
        number, amount = int(version.strip()), float(value.strip())
    except ValueError:
        number, amount = -1, math.nan
    if not sep or number < 1 or not math.isfinite(amount) or amount <= 0:
        raise ConfigError(
            name,
            f"{what}: expected '<version>:<positive number>' (as in \"1:90,2:10\"), got "
            f"'{text.strip()}'",
        )
    return number, amount


def traffic_policy(config: ParamSource) -> TrafficPolicy:
    """The config's policy (NO_POLICY when it sets neither key); ConfigError on a bad one.
    Read from the protobuf while it is validated, from the ModelSpec once a role has it."""
    name = config.name
    weights: dict[int, int] = {}
    text = _string(config, VERSION_WEIGHTS)
    if text:
        for part in text.split(","):
            version, weight = _pair(part, VERSION_WEIGHTS, name)
            if weight != int(weight) or version in weights:
                raise ConfigError(
                    name,
                    f"{VERSION_WEIGHTS}: each version once, with an integer weight; got "
                    f"'{part.strip()}'",
                )
            weights[version] = int(weight)
    shadow, ppm = 0, 0
    text = _string(config, SHADOW)
    if text:
        shadow, percent = _pair(text, SHADOW, name)
        if percent > 100:
            raise ConfigError(name, f"{SHADOW}: the share is a percentage (at most 100)")
        if shadow in weights:
            raise ConfigError(
                name, f"{SHADOW}: version {shadow} also has a weight in {VERSION_WEIGHTS}"
            )
        ppm = max(1, round(percent * 10_000))
    if not weights and not shadow:
        return NO_POLICY
    return TrafficPolicy(tuple(sorted(weights.items())), shadow, ppm)


def loaded_policy(config: ParamSource) -> TrafficPolicy:
    """The policy of a config that passed validation at load (a bad one never gets this
    far; should one, it reads as none rather than failing whoever reads it)."""
    try:
        return traffic_policy(config)
    except ConfigError:
        return NO_POLICY


def shadow_due(seen: int, ppm: int) -> bool:
    """Whether the request numbered ``seen`` (from 0) of a model is mirrored, for a share of
    ``ppm`` parts per million: exactly that share of every run of 10**6 requests, spread
    evenly (the first request is mirrored only at a share of 100 %)."""
    return (seen + 1) * ppm // 1_000_000 > seen * ppm // 1_000_000
