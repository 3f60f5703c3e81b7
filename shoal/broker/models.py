"""The broker's table of model versions and their instances (pure: no sockets, no time).

A model version is LOADING until every expected instance has reported, READY once they
all loaded, and UNAVAILABLE when one failed to load or none is left alive. The final
config of a version is the one its first ready worker completed (auto-complete runs in
the worker, which is the only process that opens the model file).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from shoal.broker.batch_config import batcher_config, memory_limit_mb, sequence_config
from shoal.broker.batcher import DynamicBatcher, serves
from shoal.broker.ordering import OrderedRelease
from shoal.broker.scheduler_hold import NO_HOLD, HoldCounts
from shoal.broker.sequencer import SequenceBatcher
from shoal.broker.stats import VersionStats
from shoal.broker.traffic import VersionPicker
from shoal.configs.ensemble import Dependency
from shoal.configs.spec_reader import spec_from_bytes
from shoal.configs.traffic import NO_POLICY, TrafficPolicy, loaded_policy
from shoal.ipc import messages as m
from shoal.ipc.errors import Code, ServingError

InstanceState = Literal["LOADING", "READY", "DEAD"]
VersionState = Literal["LOADING", "READY", "UNAVAILABLE"]


@dataclass
class Instance:
    ident: bytes
    model: str
    version: int
    index: int
    pid: int
    state: InstanceState = "LOADING"
    in_flight: m.ExecuteBatch | None = None
    dispatched_at: float = 0.0  # when in_flight was sent (monotonic)
    cores: list[int] = field(default_factory=list)
    gpu: int | None = None  # the server's id of its GPU; None: a CPU instance
    name: str = ""  # Triton's instance name (<group>_<k>), as the worker reported it
    generation: int = 0  # the load it belongs to (model control)
    checks_ready: bool = False  # its model checks its own readiness (WorkerReady)
    retiring: bool = False  # told to stop for good (its version was unloaded or replaced)
    # (when reported, [(frontend, req_id)]): requests it answered straight to their
    # frontends lately; if it dies, those answers may not have left it (router.py).
    answered: deque[tuple[float, list[tuple[bytes, int]]]] = field(default_factory=deque)
    # a decoupled model's requests it ran and still answers (until StreamsEnded), by
    # (frontend, req_id): if it dies, they fail as its batch would
    streams: dict[tuple[bytes, int], m.WorkItem] = field(default_factory=dict)


@dataclass
class ModelVersion:
    name: str
    version: int
    expected_instances: int
    platform: str = ""
    passive: frozenset[int] = frozenset()  # instance numbers never scheduled (Triton's)
    config: bytes = b""
    state: VersionState = "LOADING"
    reason: str = ""
    instances: dict[bytes, Instance] = field(default_factory=dict)
    idle: deque[bytes] = field(default_factory=deque)
    queue: deque[m.WorkItem] = field(default_factory=deque)
    failed_loads: int = 0
    ever_ready: bool = False
    batcher: DynamicBatcher | None = None
    sequencer: SequenceBatcher | None = None  # a stateful model's (sequence_batching)
    ordering: OrderedRelease | None = None
    # where its instances that may be sent requests have run (None: the CPU): a restart
    # brings one back to the same place
    placed_on: set[int | None] = field(default_factory=set)
    metric_tags: dict[str, str] = field(default_factory=dict)  # extra metric labels
    response_cache: bool = False  # its config enables it: its metrics show the cache
    memory_limit_mb: int | None = None  # its config's; None: the server's
    exits: dict[m.ExitReason, int] = field(default_factory=dict)  # instance exits unasked
    # an ensemble's composing models (shoal.configs.ensemble): it has no instances; a frontend
    # runs its steps, and it is READY once they are, and fit together
    ensemble: list[Dependency] | None = None
    generation: int = 0  # the load it belongs to: 0 at start, then one per load API call
    hold: HoldCounts = NO_HOLD  # the scheduler-delay test hooks (scheduler_hold.py)
    traffic: TrafficPolicy = NO_POLICY  # its config's, between the model's versions
    stats: VersionStats = field(init=False)

    def __post_init__(self) -> None:
        self.stats = VersionStats(self.name, self.version)

    def set_config(self, config: bytes) -> None:
        """The completed config from the first ready worker: it decides batching."""
        if self.config:
            return
        self.config = config
        spec = spec_from_bytes(config)
        self.metric_tags = dict(spec.metric_tags)
        self.response_cache = spec.response_cache
        self.memory_limit_mb = memory_limit_mb(spec)
        cfg = batcher_config(spec)
        self.traffic = loaded_policy(spec)
        self.batcher = DynamicBatcher(cfg, self.hold) if cfg is not None else None
        seq = sequence_config(spec)
        self.sequencer = SequenceBatcher(self.name, seq, self.hold) if seq is not None else None
        ordered = any(c is not None and c.preserve_ordering for c in (cfg, seq))
        self.ordering = OrderedRelease() if ordered else None

    @property
    def all_passive(self) -> bool:
        """Every instance is passive: nothing would ever run a request."""
        return self.ensemble is None and len(self.passive) >= self.expected_instances

    @property
    def pending(self) -> int:
        """Requests queued and not yet executing."""
        queued = len(self.queue) + (len(self.batcher) if self.batcher is not None else 0)
        return queued + (len(self.sequencer) if self.sequencer is not None else 0)

    def live(self) -> list[Instance]:
        return [i for i in self.instances.values() if i.state == "READY"]

    def schedulable(self) -> list[Instance]:
        """Live instances that may be sent requests (not passive)."""
        return [i for i in self.live() if i.index not in self.passive]

    def add_instance(self, inst: Instance) -> None:
        self.instances[inst.ident] = inst
        if inst.index not in self.passive:
            self.placed_on.add(inst.gpu)

    def only_gpu(self) -> int:
        """The GPU every instance of this version runs on; -1 for the CPU or several."""
        devices = {i.gpu for i in self.instances.values() if i.state != "DEAD"}
        only = devices.pop() if len(devices) == 1 else None
        return -1 if only is None else only

    def reachable_gpus(self) -> set[int | None]:
        """Where the instances that may be sent requests run or load (None: the CPU)."""
        return {
            i.gpu
            for i in self.instances.values()
            if i.state != "DEAD" and i.index not in self.passive
        }

    def unreachable(self, devices: frozenset[int]) -> ServingError | None:
        """Why no instance of this version can run a request in the CUDA memory of
        ``devices`` (the GPUs its client regions are on), or None when one can: a GPU
        instance reaches its own GPU alone, a CPU instance any (through the host). One
        that could, but has exited and not yet started again, makes it UNAVAILABLE."""
        if not devices:
            return None
        gpus = self.reachable_gpus()
        if not gpus or any(serves(g, devices) for g in gpus):
            return None  # no instance at all: the version's own state answers
        where = ", ".join(f"GPU {g}" for g in sorted(devices))
        if any(serves(g, devices) for g in self.placed_on):
            return ServingError(
                Code.UNAVAILABLE,
                f"model '{self.name}' version {self.version} has no instance running that "
                f"can read CUDA shared memory on {where}: it is being restarted",
            )
        runs = ", ".join(f"GPU {g}" for g in sorted(g for g in self.placed_on if g is not None))
        return ServingError(
            Code.INVALID_ARG,
            f"model '{self.name}' version {self.version} has no instance that can read "
            f"CUDA shared memory on {where}: its instances run on {runs}",
        )

    def load_failed(self, inst: Instance, reason: str) -> None:
        inst.state = "DEAD"
        self.failed_loads += 1
        self.reason = reason
        self.refresh_state()

    def refresh_state(self) -> None:
        """READY once every expected instance loaded (later: while one that can be sent
        requests is alive; passive ones do not count, unless all are passive, which
        refuse requests instead); LOADING while an instance is still (re)loading;
        otherwise UNAVAILABLE."""
        if self.ensemble is not None:  # its composing models decide (the broker's settle)
            return
        live = self.live()
        serving = live if self.all_passive else self.schedulable()
        loading = any(i.state == "LOADING" for i in self.instances.values())
        if serving and (self.ever_ready or len(live) >= self.expected_instances):
            self.state, self.ever_ready, self.reason = "READY", True, ""
        elif loading or not (self.ever_ready or self.failed_loads):
            self.state = "LOADING"
        else:
            self.state = "UNAVAILABLE"
            self.reason = self.reason or "every instance of the model exited"


@dataclass
class ModelEntryState:
    """A model of the repository: its versions, or why it could not be loaded."""

    name: str
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    error: str = ""
    # a load in progress (model control): its versions, READY only once they all are;
    # then they replace ``versions``, which go on serving until then
    staged: dict[int, ModelVersion] = field(default_factory=dict)
    picker: VersionPicker | None = None  # the routing state of the policy in force

    def route(self, key: str) -> int:
        """The version a request that names none goes to by the traffic policy of the
        newest ready version's config (-1: no policy, or no version ready)."""
        ready = [v for v, mv in self.versions.items() if mv.state == "READY"]
        if not ready:
            return -1
        policy = self.versions[max(ready)].traffic
        if not policy.active:
            return -1
        if self.picker is None or self.picker.policy != policy:
            self.picker = VersionPicker(policy)
        chosen = self.picker.choose(ready, key)
        return -1 if chosen is None else chosen


class ModelTable:
    def __init__(self, hold: HoldCounts = NO_HOLD) -> None:
        self.hold = hold  # every model's scheduler hold (TRITONSERVER_DELAY_SCHEDULER)
        self.models: dict[str, ModelEntryState] = {}
        self.by_ident: dict[bytes, Instance] = {}
        self.summaries = False  # a frontend serves latency summaries
        # versions a load replaced or an unload removed: their instances finish what they
        # were given, then stop (shoal.broker.control)
        self.retiring: list[ModelVersion] = []

    def add_model(
        self,
        name: str,
        versions: dict[int, int],
        platform: str,
        passive: frozenset[int] = frozenset(),
        generation: int = 0,
    ) -> None:
        """Expect ``versions`` (version -> instance count) of ``name``; the instances
        numbered in ``passive`` load but are never sent work. A later ``generation`` (a
        load through the API) is staged: see ``commit``."""
        entry = self.models.setdefault(name, ModelEntryState(name))
        into = entry.staged if generation else entry.versions
        for v, count in versions.items():
            mv = ModelVersion(
                name, v, count, platform, passive=passive, generation=generation, hold=self.hold
            )
            into[v] = mv
            if self.summaries:
                mv.stats.keep_windows()

    def add_ensemble(
        self,
        name: str,
        versions: list[int],
        config: bytes,
        deps: list[Dependency],
        generation: int = 0,
    ) -> list[ModelVersion]:
        """Expect the ``versions`` of the ensemble ``name``: LOADING until its composing
        models settle (shoal/broker/ensemble_readiness.py); staged for a ``generation``."""
        entry = self.models.setdefault(name, ModelEntryState(name))
        into = entry.staged if generation else entry.versions
        out = []
        spec = spec_from_bytes(config)
        tags, ensemble_traffic = dict(spec.metric_tags), loaded_policy(spec)
        for v in versions:
            mv = ModelVersion(name, v, 0, "ensemble", ensemble=deps, generation=generation)
            into[v] = mv
            mv.config = config
            mv.metric_tags = dict(tags)
            mv.traffic = ensemble_traffic
            if self.summaries:
                mv.stats.keep_windows()
            out.append(mv)
        return out

    def add_error(self, name: str, error: str) -> None:
        self.models[name] = ModelEntryState(name, error=error)

    def commit(self, name: str, keep: set[int] | None = None) -> list[ModelVersion]:
        """A load's staged versions replace the loaded ones, which retire (returned): they
        finish what they hold, then their instances stop; the loaded versions in ``keep``
        (unmodified: the load did not stage them) go on serving as they are. A version
        that kept answers in order hands that order on, so answers still leave in arrival
        order across it; and its statistics (and exit counts) go on counting, for both
        copies: a reload is not a new version to a client (perf_analyzer reads the counts'
        growth across it, and the Prometheus counters stay monotonic)."""
        entry = self.models[name]
        keep = keep or set()
        old = {v: mv for v, mv in entry.versions.items() if v not in keep}
        kept = {v: mv for v, mv in entry.versions.items() if v in keep}
        entry.versions = dict(sorted({**kept, **entry.staged}.items()))
        entry.staged = {}
        entry.error = ""
        for v, mv in entry.versions.items():
            before = old.get(v)
            if before is None:
                continue
            if before.ordering is not None and mv.ordering is not None:
                mv.ordering = before.ordering  # (else the old copy keeps its own to drain)
            mv.stats, mv.exits = before.stats, before.exits
        self.retiring += old.values()
        return list(old.values())

    def remove(self, name: str) -> list[ModelVersion]:
        """Unload ``name``: its versions retire (returned), a load's staged ones too."""
        entry = self.models.pop(name, None)
        if entry is None:
            return []
        gone = [*entry.versions.values(), *entry.staged.values()]
        self.retiring += gone
        return gone

    def version(self, name: str, version: int) -> ModelVersion | None:
        entry = self.models.get(name)
        return None if entry is None else entry.versions.get(version)

    def owner(self, inst: Instance) -> ModelVersion | None:
        """The version ``inst`` serves."""
        return self.find(inst.model, inst.version, inst.generation)

    def find(self, name: str, version: int, generation: int) -> ModelVersion | None:
        """That version of that load: the loaded one, a load's staged one, or one retiring
        (a reload runs a second copy of a version while the first serves)."""
        entry = self.models.get(name)
        if entry is not None:
            for versions in (entry.versions, entry.staged):
                mv = versions.get(version)
                if mv is not None and mv.generation == generation:
                    return mv
        key = (name, version, generation)
        return next((v for v in self.retiring if (v.name, v.version, v.generation) == key), None)

    def sequence_home(self, mv: ModelVersion, corrid: int | str) -> ModelVersion:
        """The copy of ``mv`` that holds the open sequence ``corrid``: a retiring one
        (replaced by a reload while the sequence ran), else ``mv`` itself."""
        if mv.sequencer is None or corrid in mv.sequencer.open:
            return mv
        for old in self.retiring:
            if (
                (old.name, old.version) == (mv.name, mv.version)
                and old.sequencer is not None
                and corrid in old.sequencer.open
                and old.schedulable()
            ):
                return old
        return mv

    def resolve(self, name: str, version: int) -> ModelVersion | None:
        """The version a request names; -1 picks the highest READY version."""
        entry = self.models.get(name)
        if entry is None:
            return None
        if version >= 0:
            return entry.versions.get(version)
        ready = [v for v in entry.versions.values() if v.state == "READY"]
        return max(ready, key=lambda v: v.version) if ready else None

    def route(self, name: str, key: str = "") -> int:
        """The version for a request to ``name`` that names none (ModelEntryState.route)."""
        entry = self.models.get(name)
        return -1 if entry is None else entry.route(key)

    def all_versions(self) -> list[ModelVersion]:
        return [v for e in self.models.values() for v in e.versions.values()]

    def stats(self, name: str, version: int) -> list[m.ModelStats]:
        """Statistics of every version (of ``name``, or of every model when "") that has
        been READY. Triton lists READY versions only; "has been" keeps a version's
        statistics in view while its instance restarts (LOADING for a moment)."""
        return [
            v.stats.snapshot()
            for v in self._shown()
            if (not name or v.name == name) and (version < 0 or v.version == version)
        ]

    def keep_summaries(self) -> None:
        """A frontend serves latency summaries: observe every version from now on."""
        self.summaries = True
        for v in self.all_versions():
            v.stats.keep_windows()

    def metrics(self, quantiles: list[float], now: float) -> list[m.VersionMetrics]:
        """The Prometheus metrics' figures, of the versions the statistics show."""
        return [
            m.VersionMetrics(
                v.stats.snapshot(),
                dict(v.stats.failures),
                v.pending,
                v.metric_tags,
                v.stats.summaries(quantiles, now),
                dict(v.exits),
                response_cache=v.response_cache,
                gpu=v.only_gpu(),
            )
            for v in self._shown()
        ]

    def _shown(self) -> list[ModelVersion]:
        return sorted(
            (v for v in self.all_versions() if v.ever_ready), key=lambda v: (v.name, v.version)
        )

    def startup_done(self) -> bool:
        return all(v.state != "LOADING" for e in self.models.values() for v in e.versions.values())

    def failures(self) -> list[str]:
        out = [f"{e.name}: {e.error}" for e in self.models.values() if e.error]
        out += [
            f"{v.name} version {v.version}: {v.reason}"
            for e in self.models.values()
            for v in e.versions.values()
            if v.state == "UNAVAILABLE"
        ]
        return out

    def all_ready(self) -> bool:
        """Strict readiness: every version READY, or unloaded (an ensemble whose composing
        model was unloaded: Triton's reason "unloaded" does not count against it)."""
        return all(
            not e.error
            and e.versions
            and all(v.state == "READY" or v.reason == "unloaded" for v in e.versions.values())
            for e in self.models.values()
        )

    def readiness_checks(self) -> list[int]:
        """The pids of the instances of READY versions whose model checks its own
        readiness (a Python model's ``is_ready``)."""
        return [
            i.pid
            for e in self.models.values()
            for v in e.versions.values()
            if v.state == "READY"
            for i in v.live()
            if i.checks_ready
        ]

    def states(self) -> list[m.ModelState]:
        out: list[m.ModelState] = []
        for e in sorted(self.models.values(), key=lambda e: e.name):
            if e.error and not e.staged:
                out.append(m.ModelState(e.name, -1, "UNAVAILABLE", e.error))
            # a model's first load shows its versions LOADING (a reload: the loaded ones)
            for v in sorted((e.versions or e.staged).values(), key=lambda v: v.version):
                instances = [
                    m.InstanceInfo(
                        i.index,
                        i.pid,
                        i.state,
                        list(i.cores),
                        i.in_flight is not None,
                        i.index in v.passive,
                        i.gpu,
                    )
                    for i in sorted(v.instances.values(), key=lambda i: i.index)
                ]
                state = m.ModelState(e.name, v.version, v.state, v.reason, instances, v.pending)
                if v.sequencer is not None:
                    state.sequences = v.sequencer.summary()
                out.append(state)
        return out
