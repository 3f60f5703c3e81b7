"""The config space ``shoal analyze`` searches, and a point of it as a model config.

A Point sets what changes how a model uses the host: how many instances, the largest
batch and the dynamic batcher (its queue delay, whether it prefers the largest batch), and
the backend's threads (ONNX Runtime's intra-op threads, OpenVINO's streams). Each knob has a
ladder of values; the search (search.py) moves one rung at a time along one knob, as Model
Analyzer's quick search does, rather than measuring the whole grid.

Pure: dictionaries in the JSON form of Triton's model config (what
``GET /v2/models/<m>/config`` returns, and a load's config override takes).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, fields, replace
from typing import Any, Final

#: The backends whose thread knob the search turns, and the parameter it sets.
THREAD_KEYS: Final = {"onnxruntime": "intra_op_thread_count", "openvino": "NUM_STREAMS"}
#: Queue delays tried with the dynamic batcher on (µs); -1: no dynamic batching.
DELAYS: Final = (-1, 0, 100, 500, 2000)


@dataclass(frozen=True, order=True)
class Point:
    """One config. ``max_batch_size`` 0: the model does not batch (left as it is);
    ``queue_delay_us`` -1: no dynamic batcher; ``threads`` 0: the backend's default."""

    instances: int = 1
    max_batch_size: int = 0
    queue_delay_us: int = -1
    prefer_max: bool = False  # preferred_batch_size = [max_batch_size]
    threads: int = 0

    def label(self) -> str:
        parts = [f"{self.instances} inst"]
        if self.max_batch_size:
            parts.append(f"mbs {self.max_batch_size}")
        if self.queue_delay_us >= 0:
            pref = ", pref max" if self.prefer_max else ""
            parts.append(f"dyn {self.queue_delay_us}us{pref}")
        if self.threads:
            parts.append(f"{self.threads} thr")
        return " / ".join(parts)


def _doubling(limit: int) -> tuple[int, ...]:
    out, n = [], 1
    while n < limit:
        out.append(n)
        n *= 2
    return (*out, limit)


@dataclass(frozen=True)
class Space:
    """The ladder of each knob (a knob with one value is not searched)."""

    instances: tuple[int, ...]
    max_batch_size: tuple[int, ...]
    queue_delay_us: tuple[int, ...]
    prefer_max: tuple[bool, ...]
    threads: tuple[int, ...]

    def neighbours(self, p: Point) -> list[Point]:
        """The points one rung away from ``p`` along one knob."""
        out: list[Point] = []
        for f in fields(Point):
            ladder: tuple[Any, ...] = getattr(self, f.name)
            here = getattr(p, f.name)
            if here not in ladder:
                continue
            i = ladder.index(here)
            for j in (i - 1, i + 1):
                if 0 <= j < len(ladder):
                    q = replace(p, **{f.name: ladder[j]})
                    if q.queue_delay_us >= 0 or not q.prefer_max:  # prefer needs the batcher
                        out.append(q)
        return out


def space_for(config: dict[str, Any], cpus: int | None = None) -> Space:
    """The space for a model whose (completed) config is ``config``, on ``cpus`` cores."""
    cores = max(1, cpus or os.cpu_count() or 1)
    mbs = int(config.get("max_batch_size", 0))
    batches = mbs > 0
    backend = str(config.get("backend", ""))
    return Space(
        instances=_doubling(min(cores, 8)),
        max_batch_size=_doubling(mbs) if batches else (0,),
        queue_delay_us=DELAYS if batches else (-1,),
        prefer_max=(False, True) if batches else (False,),
        threads=(0, *_doubling(cores)) if backend in THREAD_KEYS else (0,),
    )


def start_point(config: dict[str, Any]) -> Point:
    """The model's own config as a point (what the search starts from)."""
    groups = config.get("instance_group") or [{}]
    db = config.get("dynamic_batching")
    mbs = int(config.get("max_batch_size", 0))
    key = THREAD_KEYS.get(str(config.get("backend", "")), "")
    raw = (config.get("parameters") or {}).get(key, {}).get("string_value", "0")
    return Point(
        instances=max(1, sum(int(g.get("count", 1)) for g in groups)),
        max_batch_size=mbs,
        queue_delay_us=int(db.get("max_queue_delay_microseconds", 0)) if db is not None else -1,
        prefer_max=db is not None and [int(b) for b in db.get("preferred_batch_size", [])] == [mbs],
        threads=int(raw) if raw.isdigit() else 0,
    )


def apply(config: dict[str, Any], p: Point) -> dict[str, Any]:
    """``config`` (not changed) set to ``p``: the config override a load takes."""
    cfg = copy.deepcopy(config)
    group = dict((cfg.get("instance_group") or [{"kind": "KIND_CPU"}])[0])
    group["count"] = p.instances
    group.pop("name", None)
    cfg["instance_group"] = [group]
    if p.max_batch_size:
        cfg["max_batch_size"] = p.max_batch_size
    if p.queue_delay_us >= 0:
        db = dict(cfg.get("dynamic_batching") or {})
        db["max_queue_delay_microseconds"] = p.queue_delay_us
        db["preferred_batch_size"] = [p.max_batch_size] if p.prefer_max else []
        cfg["dynamic_batching"] = db
    else:
        cfg.pop("dynamic_batching", None)
    key = THREAD_KEYS.get(str(cfg.get("backend", "")))
    if key is not None:
        params = dict(cfg.get("parameters") or {})
        if p.threads:
            params[key] = {"string_value": str(p.threads)}
        else:
            params.pop(key, None)
        cfg["parameters"] = params
    return cfg
