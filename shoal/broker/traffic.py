"""Which version answers a request that names none, by the model's TrafficPolicy
(shoal/configs/traffic.py). Pure: no sockets, no clock, no random source.

Unkeyed requests follow smooth weighted round-robin (nginx's): over any run of requests
as long as the sum of the weights, while the ready versions stay the same, each version
gets exactly its weight, spread out rather than in bursts. The split is therefore exact
over a bounded number of requests, not a matter of chance.

A request with a route key (the ``shoal_route_key`` parameter) goes where weighted
rendezvous hashing sends the key: each ready weighted version scores the key
(``-weight / ln(u)``, ``u`` a hash of the key and the version in (0, 1)) and the highest
score wins. The share of keys each version gets follows its weight; a key keeps its
version across restarts (the hash is BLAKE2b, not Python's salted ``hash``), and when a
version leaves only its own keys move, to the others in proportion to their weights.

A weighted version that is not READY gives its weight to the ready ones: the round starts
again among those, so the split is exact from the next request on. When none of
the weighted versions is ready, the highest ready version takes the traffic, as without a
policy; the shadow version takes it only if it is the one version ready.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection

from shoal.configs.traffic import TrafficPolicy

_SCALE = float(1 << 64)


def _unit(key: str, version: int) -> float:
    """A number in (0, 1), the same for the same key and version on every host."""
    digest = hashlib.blake2b(f"{version}\x00{key}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 0.5) / _SCALE


def sticky_version(candidates: list[tuple[int, int]], key: str) -> int:
    """The version (of ``candidates``: (version, weight), weights > 0) that owns ``key``."""
    return max(candidates, key=lambda vw: (-vw[1] / math.log(_unit(key, vw[0])), -vw[0]))[0]


class VersionPicker:
    """The routing state of one model's policy: the round-robin's running scores. A new
    policy (a reload with other weights) gets a new picker; requests already admitted keep
    the version they were given, so a change drops none. One thread: the broker's loop."""

    def __init__(self, policy: TrafficPolicy) -> None:
        self.policy = policy
        self._current: dict[int, int] = {}

    def choose(self, ready: Collection[int], key: str = "") -> int | None:
        """The version of ``ready`` for a request that names none (None: none is ready)."""
        candidates = [(v, w) for v, w in self.policy.weights if v in ready]
        if not candidates:
            rest = [v for v in ready if v != self.policy.shadow]
            return max(rest or ready, default=None)
        if key:
            return sticky_version(candidates, key)
        return self._smooth(candidates)

    def _smooth(self, candidates: list[tuple[int, int]]) -> int:
        total = sum(w for _, w in candidates)
        if self._current.keys() != {v for v, _ in candidates}:
            self._current = {v: 0 for v, _ in candidates}  # a version came or went: a new round
        best, best_score = candidates[0][0], None
        for v, w in candidates:
            score = self._current.get(v, 0) + w
            self._current[v] = score
            if best_score is None or score > best_score:
                best, best_score = v, score
        self._current[best] -= total
        return best
