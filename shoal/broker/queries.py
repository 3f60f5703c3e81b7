"""The broker's answers to what frontends ask about models and the server (pure: the model
table in, the reply out; no sockets).

The version a request or a query names, or Triton's error for why not (``lookup``, and
``admissible`` on every request's way in); a model's metadata, Triton's statistics, the
server's readiness and the state of each version (with each instance's memory and
rate-limiter turns when asked), and the figures of the metrics page. Instances' memory is
read through ``read`` (/proc by default), passed in as the clock is elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable

from shoal.broker import memory
from shoal.broker.batcher import cuda_devices
from shoal.broker.client_shm_requests import ClientRegions
from shoal.broker.control import ModelControl
from shoal.broker.endings import Endings
from shoal.broker.models import ModelTable, ModelVersion
from shoal.broker.router import Router
from shoal.configs import namespaces
from shoal.ipc import messages as m
from shoal.ipc.errors import UNKNOWN_MODEL, Code, ServingError, unknown_model


class Queries:
    def __init__(
        self,
        table: ModelTable,
        control: ModelControl,
        router: Router,
        endings: Endings,
        client_regions: ClientRegions,
        namespacing: bool = False,
        read: Callable[[int], int | None] = memory.private_memory,
    ) -> None:
        self.table, self.control, self.router, self.endings = table, control, router, endings
        self.client_regions = client_regions
        self.namespacing = namespacing  # qualified names (shoal/configs/namespaces.py)
        self._read = read

    def lookup(self, name: str, version: int) -> ModelVersion:
        """The READY version a request or query names, else Triton's error for why not
        (each reason after UNKNOWN_MODEL, as Triton's GetModel writes it)."""
        entry = self.table.models.get(name)
        if entry is None and self.namespacing:
            ambiguous = namespaces.ambiguity(name, list(self.table.models))
            if ambiguous:
                raise ServingError(Code.INVALID_ARG, ambiguous)
        if entry is None and self.control.unloaded.get(name):
            # unloaded, or its load failed (Triton's words; 404: it will not come back alone)
            raise ServingError(Code.NOT_FOUND, f"{UNKNOWN_MODEL}'{name}' has no available versions")
        if entry is None:
            raise unknown_model(name)
        if version >= 0:
            mv = entry.versions.get(version)
            if mv is None and version not in self.control.gone_versions.get(name, ()):
                raise ServingError(
                    Code.NOT_FOUND, f"{UNKNOWN_MODEL}'{name}' version {version} is not found"
                )
            if mv is None or mv.state != "READY":  # (one a reload unloaded: Triton keeps it)
                raise ServingError(
                    Code.UNAVAILABLE,
                    f"{UNKNOWN_MODEL}'{name}' version {version} is not at ready state",
                )
            return mv
        mv = self.table.resolve(name, -1)
        if mv is None:
            # 503 rather than Triton's 404: an instance may be restarting; retrying helps.
            raise ServingError(
                Code.UNAVAILABLE,
                entry.error or f"{UNKNOWN_MODEL}'{name}' has no available versions",
            )
        return mv

    def admissible(self, req: m.InferRequest) -> tuple[ModelVersion, list[m.ClientRegion]]:
        """The version that will run ``req`` and the client regions it references, or
        ServingError with Triton's reason why not. Nothing is held or queued yet."""
        version = req.version
        if version < 0:  # by the model's traffic policy (shoal/broker/traffic.py), if any
            # a sequence's requests all go where its id hashes: its state is in one version
            key = req.route_key or (str(req.sequence_id) if req.sequence_id else "")
            version = self.table.route(req.model, key)
        mv = self.lookup(req.model, version)
        if mv.sequencer is not None and req.sequence_id and not req.sequence_start:
            # a sequence that began before a reload ends on the copy that holds its state
            mv = self.table.sequence_home(mv, req.sequence_id)
        req.version = mv.version  # -1 resolved once: its answer finds the same version
        if mv.ensemble is not None:  # a frontend runs its steps, never the broker
            raise ServingError(Code.INTERNAL, f"ensemble '{mv.name}' sent to the scheduler")
        clients = self.client_regions.resolve(req)
        if mv.all_passive:
            # Triton would queue it forever: no instance of a passive group is scheduled.
            raise ServingError(
                Code.UNAVAILABLE,
                f"model '{mv.name}' version {mv.version} has only passive instances, "
                "which are never sent requests",
            )
        unreachable = mv.unreachable(cuda_devices(clients))
        if unreachable is not None:
            raise unreachable
        return mv, clients

    def model_info(self, q: m.ModelQuery) -> m.ModelInfo:
        try:
            mv = self.lookup(q.model, q.version)
        except ServingError as err:
            return m.ModelInfo(q.query_id, m.ErrorInfo(int(err.code), err.message), q.model)
        entry = self.table.models[q.model]
        ready = sorted(v.version for v in entry.versions.values() if v.state == "READY")
        checks = [i.pid for i in mv.live() if i.checks_ready]
        return m.ModelInfo(
            q.query_id, None, q.model, mv.version, ready, True, mv.platform, mv.config, checks
        )

    def stats(self, q: m.StatsQuery) -> m.StatsReply:
        """Triton's TRITONSERVER_ServerModelStatistics: the statistics API knows only
        versions that are (here: have been) READY, and answers INVALID_ARG with its own
        wording, not the "unknown model" of the other endpoints. Without a model name
        the version is ignored."""
        if not q.model:
            return m.StatsReply(q.query_id, None, self.table.stats("", -1))
        shown = self.table.stats(q.model, -1)
        picked = [s for s in shown if q.version < 0 or s.version == str(q.version)]
        if picked:
            return m.StatsReply(q.query_id, None, picked)
        if shown:
            message = f"requested model version is not available for model '{q.model}'"
        else:
            message = f"requested model '{q.model}' is not available"
        return m.StatsReply(q.query_id, m.ErrorInfo(int(Code.INVALID_ARG), message))

    def server_state(
        self,
        q: m.ServerQuery,
        strict_readiness: bool = True,
        await_launcher: bool = False,
        started: bool = True,
    ) -> m.ServerState:
        """Whether the server is ready, and each version's state. Ready: every model
        loaded; without ``strict_readiness``, the start-up loads over (``started``),
        whatever became of them, as Triton's server turns ready once its start-up loads
        return; and in explicit or poll mode the launcher there when ``await_launcher``
        (the load API is not served until it is). Under ``strict_readiness``, as Triton's
        server readiness asks each READY model's own runtime check, the instances whose
        model checks its own readiness are named (``ready_checks``): the frontend asks
        them."""
        control = self.control
        ready = self.table.all_ready() and not control.failures()
        checks = self.table.readiness_checks() if ready and strict_readiness else []
        ready = ready or (not strict_readiness and started)
        if await_launcher and control.managed and not control.has_launcher:
            ready = False
        states = self.table.states()
        if control.managed:  # (mode none: every model of the repository is there)
            states = sorted([*states, *control.index()], key=lambda s: (s.name, s.version))
        if q.memory_of:
            self._add_details(states, q.memory_of)
        return m.ServerState(q.query_id, True, ready, states, checks if ready else [])

    def _add_details(self, states: list[m.ModelState], model: str) -> None:
        """Each instance's memory, the memory limit, and each instance's turns under the
        rate limiter, of ``model``'s versions."""
        limiter = self.router.limiter
        for state in states:
            if state.name != model:
                continue
            if state.version >= 0:
                state.memory_limit_mb = self.endings.limit_mb(state.name, state.version)
            mv = self.table.version(state.name, state.version)
            known = {(i.index, i.pid): i for i in mv.instances.values()} if mv is not None else {}
            for info in state.instances:
                used = self._read(info.pid) if info.pid else None
                info.memory_mb = None if used is None else used // memory.MIB
                inst = known.get((info.index, info.pid))
                if limiter is not None and inst is not None:
                    info.rate_limiter = limiter.turns(inst)

    def metrics(self, quantiles: list[float], now: float) -> list[m.VersionMetrics]:
        """The figures of the metrics page, with each instance's memory read now."""
        versions = self.table.metrics(quantiles, now)
        for vm in versions:
            mv = self.table.version(vm.stats.name, int(vm.stats.version))
            if mv is None:
                continue
            vm.memory_limit = self.endings.limit_mb(mv.name, mv.version) * memory.MIB
            for inst in mv.instances.values():
                used = self._read(inst.pid)
                if used is not None:
                    vm.memory[inst.index] = used
        return versions
