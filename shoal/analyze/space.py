"""The config space ``shoal analyze`` searches, and a point of it as a model config.

A Point sets what changes how a model uses the host: how many instances and of which kind
(KIND_CPU, or KIND_GPU on the GPUs the analysis may use), the largest batch and the
dynamic batcher (its queue delay, whether it prefers the largest batch), and the
backend's threads (ONNX Runtime's intra-op threads and its inter-op threads, which run a
graph's independent branches at once in its parallel execution mode; OpenVINO's
streams). Each knob has a
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
#: ONNX Runtime's parameters for its execution mode ("1": parallel) and inter-op pool.
ORT_MODE: Final = "execution_mode"
ORT_INTER: Final = "inter_op_thread_count"
#: The backends whose models may run on a GPU (a Python model decides for itself).
GPU_BACKENDS: Final = frozenset({"onnxruntime", "pytorch", "tensorrt"})


@dataclass(frozen=True, order=True)
class Point:
    """One config. ``max_batch_size`` 0: the model does not batch (left as it is);
    ``queue_delay_us`` -1: no dynamic batcher; ``threads`` 0: the backend's default;
    ``inter_threads`` 0: ONNX Runtime's sequential execution, N: its parallel execution
    with N inter-op threads (-1: parallel, with the backend's default pool);
    ``instances``: per GPU for KIND_GPU, as Triton counts them."""

    instances: int = 1
    max_batch_size: int = 0
    queue_delay_us: int = -1
    prefer_max: bool = False  # preferred_batch_size = [max_batch_size]
    threads: int = 0
    inter_threads: int = 0
    kind: str = "KIND_CPU"

    def label(self) -> str:
        gpu = "/GPU" if self.kind == "KIND_GPU" else ""
        parts = [f"{self.instances} inst{gpu}"]
        if self.max_batch_size:
            parts.append(f"mbs {self.max_batch_size}")
        if self.queue_delay_us >= 0:
            pref = ", pref max" if self.prefer_max else ""
            parts.append(f"dyn {self.queue_delay_us}us{pref}")
        if self.threads:
            parts.append(f"{self.threads} thr")
        if self.inter_threads:
            n = self.inter_threads
            parts.append("parallel" + (f" {n} inter" if n > 0 else ""))
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
    inter_threads: tuple[int, ...] = (0,)
    kind: tuple[str, ...] = ("KIND_CPU",)
    gpus: tuple[int, ...] = ()  # the GPUs a KIND_GPU point's instances go to

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


def space_for(config: dict[str, Any], cpus: int | None = None, gpus: tuple[int, ...] = ()) -> Space:
    """The space for a model whose (completed) config is ``config``, on ``cpus`` cores
    and, where its backend can use one, the GPUs ``gpus`` (see ``gpu_choice``)."""
    cores = max(1, cpus or os.cpu_count() or 1)
    mbs = int(config.get("max_batch_size", 0))
    batches = mbs > 0
    backend = str(config.get("backend", ""))
    on_gpu = bool(gpus) and (backend in GPU_BACKENDS or backend == "python")
    return Space(
        instances=_doubling(min(cores, 8)),
        max_batch_size=_doubling(mbs) if batches else (0,),
        queue_delay_us=DELAYS if batches else (-1,),
        prefer_max=(False, True) if batches else (False,),
        threads=(0, *_doubling(cores)) if backend in THREAD_KEYS else (0,),
        inter_threads=(0, *_doubling(cores)) if backend == "onnxruntime" else (0,),
        kind=("KIND_CPU", "KIND_GPU") if on_gpu else ("KIND_CPU",),
        gpus=gpus if on_gpu else (),
    )


def gpu_choice(asked: str | None, present: int) -> tuple[tuple[int, ...], str]:
    """The GPUs the search may use, and a note to show (empty: none to show). ``asked``:
    ``--gpu``'s value (None: not given: every GPU present; "all"; "none"; or device ids
    such as "0,2"); ``present``: the GPUs this host shows. A GPU asked for on a host
    without one is a note, not an error: the search stays on KIND_CPU. An id the host
    does not have is a ValueError."""
    if asked == "none":
        return (), ""
    if present == 0:
        if asked is None:
            return (), ""
        return (), (
            "--gpu: this host shows no GPU (no NVIDIA driver, or CUDA_VISIBLE_DEVICES hides "
            "them all): the search stays on KIND_CPU"
        )
    if asked is None or asked == "all":
        return tuple(range(present)), ""
    try:
        ids = tuple(sorted({int(x) for x in asked.split(",") if x.strip()}))
    except ValueError:
        raise ValueError(f"--gpu: all, none or device ids such as 0,1; got {asked}") from None
    wrong = [i for i in ids if not 0 <= i < present]
    if wrong or not ids:
        raise ValueError(f"--gpu: this host has GPUs 0-{present - 1}; got {asked}")
    return ids, ""


def start_point(config: dict[str, Any]) -> Point:
    """The model's own config as a point (what the search starts from)."""
    groups = config.get("instance_group") or [{}]
    db = config.get("dynamic_batching")
    mbs = int(config.get("max_batch_size", 0))
    key = THREAD_KEYS.get(str(config.get("backend", "")), "")
    params = config.get("parameters") or {}
    raw = params.get(key, {}).get("string_value", "0")
    inter = 0
    if config.get("backend") == "onnxruntime" and _param(params, ORT_MODE) == "1":
        count = _param(params, ORT_INTER)
        inter = int(count) if count.isdigit() and int(count) > 0 else -1
    return Point(
        instances=max(1, sum(int(g.get("count", 1)) for g in groups)),
        max_batch_size=mbs,
        queue_delay_us=int(db.get("max_queue_delay_microseconds", 0)) if db is not None else -1,
        prefer_max=db is not None and [int(b) for b in db.get("preferred_batch_size", [])] == [mbs],
        threads=int(raw) if raw.isdigit() else 0,
        inter_threads=inter,
        kind="KIND_GPU" if groups[0].get("kind") == "KIND_GPU" else "KIND_CPU",
    )


def _param(params: dict[str, Any], key: str) -> str:
    return str(params.get(key, {}).get("string_value", "")).strip()


def apply(config: dict[str, Any], p: Point, gpus: tuple[int, ...] = ()) -> dict[str, Any]:
    """``config`` (not changed) set to ``p``: the config override a load takes. A
    KIND_GPU point's instances go to ``gpus`` (none given: the group's own, else all)."""
    cfg = copy.deepcopy(config)
    group = dict((cfg.get("instance_group") or [{"kind": "KIND_CPU"}])[0])
    group["count"] = p.instances
    group.pop("name", None)
    group["kind"] = p.kind
    if p.kind == "KIND_GPU" and gpus:
        group["gpus"] = list(gpus)
    elif p.kind != "KIND_GPU":
        group.pop("gpus", None)
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
        if key == THREAD_KEYS["onnxruntime"]:
            _ort_execution(params, p.inter_threads)
        cfg["parameters"] = params
    return cfg


def _ort_execution(params: dict[str, Any], inter: int) -> None:
    """ONNX Runtime's execution mode and inter-op pool, as ``inter`` says (Point)."""
    if inter == 0:
        params.pop(ORT_MODE, None)
        params.pop(ORT_INTER, None)
        return
    params[ORT_MODE] = {"string_value": "1"}
    if inter > 0:
        params[ORT_INTER] = {"string_value": str(inter)}
    else:
        params.pop(ORT_INTER, None)
