"""Explicit model control: the repository extension's load and unload (no sockets).

A load reads the model's directory again (its config, or the one the request gives),
plans its instances beside the loaded models' and stages them as a new *generation*:
the launcher starts their workers, and the loaded versions, if any, go on serving.
Once every staged version is READY, they replace the loaded ones (``ModelTable.commit``)
and those retire: they run what they hold, then their workers stop for good. A load
that fails leaves the loaded versions serving. An unload retires the versions at once
(new requests find no model) and is answered once their workers have stopped.

An ensemble's composing models that are not loaded load first, in the same call; then
the ensemble's steps are checked against them, as at start. Operations on one model run
one after another, and one that would touch a model another is loading or unloading (an
ensemble's composing model) waits for it; each answers every client that asked for it.
An unload cancels the load of the same model it finds under way.

Nothing waits for ever: a staged instance whose worker has not said hello within
``START_DEADLINE_S`` fails its load, and the launcher is told which loads are gone, so
that it restarts none of their workers again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from shoal.broker.models import Instance, ModelTable, ModelVersion
from shoal.broker.repository_sync import RepositorySync
from shoal.broker.reuse import LoadedStamps
from shoal.configs import repository
from shoal.configs.devices import gpu_count
from shoal.configs.ensemble import Dependency, dependencies, is_ensemble
from shoal.configs.model_config import parse_config_json
from shoal.configs.model_control import load_file_parts
from shoal.configs.model_stamps import ModelStamps, newest
from shoal.configs.placement import instance_count, loadable, passive_instances, plan_instances
from shoal.configs.repository import ModelEntry
from shoal.configs.schema import ConfigError
from shoal.ipc import messages as m
from shoal.ipc.errors import MODEL_CONTROL_DISABLED, Code, ServingError

log = logging.getLogger("shoal.broker.control")

#: How long a load waits for each staged instance's worker to say hello (it says hello
#: before it loads its model: a slow model load is not cut short by this).
START_DEADLINE_S = 60.0


def poll_failed(name: str, why: str = "") -> ServingError:
    """Triton's answer when the model's directory cannot be read as a model (missing, a
    config that does not parse or validate, files without a config): INTERNAL, "failed
    to load '<m>', failed to poll from model repository". Triton only logs the detail;
    shoal adds it after a colon."""
    head = f"failed to load '{name}', failed to poll from model repository"
    detail = why.removeprefix(f"failed to load '{name}': ").removeprefix(f"failed to load '{name}'")
    return ServingError(Code.INTERNAL, f"{head}: {detail}" if detail else head)


def not_in_repository(name: str) -> str:
    """Triton's error line for a model to load that no repository holds."""
    return f"failed to poll model '{name}': model not found in any model repository."


def load_failed(name: str, versions: list[ModelVersion]) -> ServingError:
    """Triton's answer when versions failed to load (400): "load failed for model '<m>':
    version <v> is at UNAVAILABLE state: <why>;" for each, each line ended by a newline."""
    lines = "".join(f"version {v.version} is at UNAVAILABLE state: {v.reason};\n" for v in versions)
    return ServingError(Code.INVALID_ARG, f"load failed for model '{name}': {lines}")


@dataclass
class Operation:
    action: str  # load | unload
    model: str
    config: str = ""
    files: dict[str, bytes] = field(default_factory=dict)  # file:<version>/<path> -> bytes
    unload_dependents: bool = False
    waiters: list[tuple[bytes, int]] = field(default_factory=list)  # (frontend, query_id)
    started: bool = False
    generation: int = 0
    # a load: the composing models it loads first (an ensemble's), and then the ensemble
    parts: list[str] = field(default_factory=list)
    ensemble: ModelEntry | None = None
    entries: dict[str, ModelEntry] = field(default_factory=dict)  # what it stages
    error: ServingError | None = None
    started_at: float = 0.0
    fetched: bool = False  # its model's files are in the repository view
    claims: set[str] = field(default_factory=set)  # the models it loads or unloads
    cancelled: bool = False  # a load an unload of its model overtook
    blocked_by: set[str] = field(default_factory=set)  # claimed by others when it tried
    # model -> its loaded versions this load keeps serving as they are (unmodified)
    kept: dict[str, set[int]] = field(default_factory=dict)
    stamps: dict[str, ModelStamps] = field(default_factory=dict)  # its models' directories


@dataclass
class Effects:
    """What the broker does for a turn of model control."""

    start: list[m.WorkerSpec] = field(default_factory=list)  # to the launcher
    stop: list[Instance] = field(default_factory=list)  # Shutdown(retire=True)
    replies: list[tuple[bytes, m.ControlReply]] = field(default_factory=list)
    changed: set[str] = field(default_factory=set)  # ModelsChanged to the frontends
    ensembles: list[ModelVersion] = field(default_factory=list)  # staged: to settle
    gone: list[int] = field(default_factory=list)  # loads with nothing left (the launcher)

    def __iadd__(self, other: Effects) -> Effects:
        self.start += other.start
        self.stop += other.stop
        self.gone += other.gone
        self.replies += other.replies
        self.changed |= other.changed
        self.ensembles += other.ensembles
        return self


class ModelControl:
    def __init__(
        self,
        table: ModelTable,
        repo: Path,
        runtime_dir: Path,
        *,
        explicit: bool,
        model_config_name: str = "",
        autocomplete: bool = True,
        poll_secs: float = 0.0,
    ) -> None:
        self.table = table
        self.repo = repo
        self.runtime_dir = runtime_dir
        self.explicit = explicit
        # poll mode (> 0): the repository is rescanned this often; what changed on disk
        # loads, reloads or unloads (the API is refused, as in mode none)
        self.poll_secs = poll_secs
        self._stamps: dict[str, int] = {}  # model -> its directory's stamp when last read
        self._next_poll = 0.0
        self.model_config_name = model_config_name
        self.autocomplete = autocomplete
        self.loaded: dict[str, ModelEntry] = {}  # the entries of the loaded models
        # when each loaded model's directory last changed, as its load read it (none for
        # one loaded from a request's files): what a load may leave as it is
        self.stamps = LoadedStamps(model_config_name)
        # the versions a reload of a loaded model unloaded (Triton keeps them, UNAVAILABLE)
        self.gone_versions: dict[str, set[int]] = {}
        # The models of the repository that are not loaded, for the index: never loaded
        # ({}: listed by name alone), or each version it had, and why it has not now
        # ("unloaded", or why its load failed: that one keeps the server from being ready)
        self.unloaded: dict[str, dict[int, str]] = {}
        # loaded by name (--load-model, the API), not only as an ensemble's composing model
        self.named: set[str] = set()
        # model -> why the rate limiter cannot schedule it (its needs are the repository's
        # at start: shoal/configs/rate_limits.py)
        self.refused: dict[str, str] = {}
        self.ops: dict[str, deque[Operation]] = {}
        self.has_launcher = False
        self._generation = 0
        # what a load wrote for its workers (its config, its files), removed with its last
        # version
        self._written: dict[int, list[Path]] = {}
        self._live: set[int] = set()  # loads (generations) that may have versions
        self._spawned: set[int] = set()  # those that asked the launcher for workers
        self._claimed: dict[str, Operation] = {}  # model -> the started op that touches it
        # a repository view (several repositories, object storage): synced off the turn;
        # a load waits for its model's files, the index and rescans ask for a sync
        self.view_sync: RepositorySync | None = None

    @property
    def busy(self) -> bool:
        return bool(self.ops) or bool(self.table.retiring)

    @property
    def managed(self) -> bool:
        """Models load and unload while the server runs (explicit or poll mode): the
        launcher starts and stops their workers."""
        return self.explicit or self.poll_secs > 0

    def started_with(self, entries: list[ModelEntry]) -> None:
        """The models that load at start: their entries, and (models load and unload
        while serving) their directories' stamps."""
        self.loaded = {e.name: e for e in entries if not e.error and e.config}
        if self.managed:
            self.stamps.of = {n: self.stamps.read(e) for n, e in self.loaded.items()}

    # -- poll mode -------------------------------------------------------------------

    def start_polling(self, now: float) -> None:
        """Remember how the repository's models look at start (they load as in mode none)."""
        with contextlib.suppress(OSError):  # (unreadable: the first rescan finds all new)
            self._stamps = {n: newest(self.repo / n) for n in repository.model_dirs(self.repo)}
        self._next_poll = now + self.poll_secs

    def poll(self, now: float) -> Effects:
        """Every ``poll_secs``: a model directory that appeared or changed (the newest
        modification time of anything in it, as Triton compares) loads or reloads, one
        that went away unloads. A load that fails leaves what was loaded serving; it is
        tried again once its directory changes again."""
        out = Effects()
        if self.poll_secs <= 0 or now < self._next_poll or not self.has_launcher:
            return out  # (without a launcher, under supervisord, nothing could load)
        self._next_poll = now + self.poll_secs
        if self.view_sync is not None:
            self.view_sync.kick()  # (what it brings, the next rescan sees)
        try:
            names = repository.model_dirs(self.repo)
        except OSError as exc:  # (a network file system's hiccup): nothing is unloaded
            log.warning("poll: cannot read the model repository: %s", exc)
            return out
        # a directory that cannot be read now keeps the stamp it had (no reload for that)
        stamps = {n: newest(self.repo / n) or self._stamps.get(n, 0) for n in names}
        for name in sorted(set(self._stamps) - set(stamps)):
            log.info("poll: %s was removed from the repository: unloading it", name)
            self._enqueue(Operation("unload", name))
        for name, stamp in sorted(stamps.items()):
            if self._stamps.get(name) != stamp:
                log.info("poll: %s is new or changed: loading it", name)
                self._enqueue(Operation("load", name))
        self._stamps = stamps
        out += self.tick()
        return out

    def _enqueue(self, op: Operation) -> None:
        queue = self.ops.setdefault(op.model, deque())
        last = queue[-1] if queue else None
        if last is None or last.started or last.action != op.action:
            queue.append(op)  # (the same as the last one waiting: that one does it)

    # -- requests --------------------------------------------------------------------

    def request(self, frontend: bytes, msg: m.ModelControl) -> Effects:
        """A frontend's load or unload; answered now if refused, else once it settles."""
        out = Effects()
        refusal = self._refusal(msg)
        if refusal is not None:
            out.replies.append((frontend, _reply(msg.query_id, refusal)))
            return out
        queue = self.ops.setdefault(msg.model, deque())
        # The same unload again, right behind one that waits: one operation, answered to
        # both (one further back would jump what came between).
        last = queue[-1] if queue else None
        same = (
            last
            if last is not None and not last.started and last.action == msg.action == "unload"
            and last.unload_dependents == msg.unload_dependents
            else None
        )  # fmt: skip
        if same is None:
            op = Operation(
                msg.action, msg.model, msg.config, dict(msg.files), msg.unload_dependents
            )
            head = queue[0] if queue else None
            if msg.action == "unload" and head is not None and head.action == "load":
                head.cancelled = True  # (if it has not settled yet)
            queue.append(op)
            same = op
        same.waiters.append((frontend, msg.query_id))
        out += self.tick()
        return out

    def _refusal(self, msg: m.ModelControl) -> ServingError | None:
        if not self.explicit:  # mode none, or poll
            return ServingError(Code.UNAVAILABLE, MODEL_CONTROL_DISABLED)
        try:
            repository.check_model_name(msg.model)
        except ConfigError as err:
            return ServingError(Code.INVALID_ARG, err.message)
        if msg.action not in ("load", "unload"):
            return ServingError(Code.INVALID_ARG, f"unexpected model control '{msg.action}'")
        if not self.has_launcher:  # supervisord: it would restart what an unload stops
            return ServingError(
                Code.UNAVAILABLE,
                f"failed to {msg.action} '{msg.model}': no launcher is connected to start and "
                "stop its instances (model control through the API needs shoal serve)",
            )
        if msg.action == "load" and msg.model in self.refused:
            return ServingError(Code.INVALID_ARG, self.refused[msg.model])
        return None

    # -- progress --------------------------------------------------------------------

    def tick(self, now: float | None = None) -> Effects:
        """Start what can start, settle what has settled, stop what has drained."""
        now = time.monotonic() if now is None else now
        out = Effects()
        out.stop += self._drained(out)  # (forgets those whose instances are gone)
        for name in list(self.ops):
            queue = self.ops[name]
            while queue:
                op = queue[0]
                try:
                    if not op.started and not self._begin(op, now, out):
                        break  # another operation is loading or unloading a model it touches
                    if not self._settle(op, now, out):
                        break
                except Exception as exc:  # a bug must neither hang its clients nor the broker
                    log.exception("model control of '%s' failed", op.model)
                    op.started = True
                    op.error = ServingError(
                        Code.INTERNAL, f"failed to {op.action} '{op.model}': {exc}"
                    )
                    if op.action == "load":
                        self._discard(op, out)
                queue.popleft()
                for claimed in op.claims:
                    if self._claimed.get(claimed) is op:
                        del self._claimed[claimed]
                for frontend, query_id in op.waiters:
                    out.replies.append((frontend, _reply(query_id, op.error)))
            if not queue:
                del self.ops[name]
        out.stop += self._drained(out)  # those just replaced or unloaded too
        return out

    def _drained(self, out: Effects) -> list[Instance]:
        """Retiring versions with nothing left to run (no request queued or running, no
        sequence still open on them): their instances are told to stop (once); a version
        whose instances have all gone is forgotten."""
        stop: list[Instance] = []
        for mv in list(self.table.retiring):
            if not mv.instances:  # every exit seen (and what the last held answered)
                self.table.retiring.remove(mv)
                self._generation_gone(mv.generation, out)
                continue
            live = [i for i in mv.instances.values() if i.state != "DEAD"]
            if not live:
                continue  # killed: its exit, not seen yet, answers what it held
            sequences = mv.sequencer is not None and mv.sequencer.holds_work()
            if mv.pending or sequences or any(i.in_flight is not None for i in live):
                continue
            for inst in live:
                if not inst.retiring:
                    inst.retiring = True
                    stop.append(inst)
        return stop

    def _claim(self, op: Operation, names: set[str]) -> bool:
        """Whether ``op`` may touch ``names`` now (no other started op does); claimed."""
        if any(self._claimed.get(n, op) is not op for n in names):
            return False
        for n in names:
            self._claimed[n] = op
        op.claims |= names
        return True

    def _begin(self, op: Operation, now: float, out: Effects) -> bool:
        """Start ``op``, unless another started operation touches one of its models."""
        if op.action == "unload":
            return self._begin_unload(op, out)
        return self._begin_load(op, now, out)

    def _begin_unload(self, op: Operation, out: Effects) -> bool:
        """An unload takes its model (and, when asked, the composing models no one else
        uses) out of the table at once; their workers drain and stop."""
        names = [op.model]
        if op.unload_dependents:  # Triton's: the composing models no one else uses
            names += self._composing_only(op.model)
        if not self._claim(op, set(names)):
            return False
        op.started, op.parts = True, names
        for name in names:
            gone = self.table.remove(name)
            self.loaded.pop(name, None)
            self.stamps.of.pop(name, None)
            self.named.discard(name)
            earlier = dict.fromkeys(self.gone_versions.pop(name, set()), "unloaded")
            if gone:
                self.unloaded[name] = {**earlier, **{v.version: "unloaded" for v in gone}}
                out.changed.add(name)
                log.info("unloading %s (%d version(s))", name, len(gone))
            elif self.unloaded.get(name):  # a failed load's versions: unloaded now
                self.unloaded[name] = dict.fromkeys(self.unloaded[name], "unloaded")
        return True

    def _begin_load(self, op: Operation, now: float, out: Effects) -> bool:
        """A load reads its config (and files) and stages the workers of its versions,
        unless it has nothing to do or is refused first."""
        if op.blocked_by and any(self._claimed.get(n, op) is not op for n in op.blocked_by):
            return False  # (tried again once those are released, not on every turn)
        if self.view_sync is not None and self.explicit and not op.files and not op.fetched:
            done, why = self.view_sync.fetched(op.model)
            if not done:
                return False  # (its files are on their way)
            op.fetched = True
            if why:
                op.started, op.error = True, poll_failed(op.model, why)
                return True
        op.started = True
        if op.cancelled:  # an unload of its model came before it began
            op.error = ServingError(
                Code.UNAVAILABLE, f"failed to load '{op.model}': an unload of it came first"
            )
            return True
        if op.model in self.refused:  # (a poll: the API refuses it before)
            op.error = ServingError(Code.INVALID_ARG, self.refused[op.model])
            return True
        # (Triton's: a load with no config or files of its own, of a loaded model none of
        # whose files changed, leaves it as it is)
        loaded = self.loaded.get(op.model)
        plain = not op.config and not op.files and op.model in self.table.models
        if plain and loaded is not None and self.stamps.unchanged(loaded):
            self.named.add(op.model)
            log.info("%s is unmodified: it serves on as it is", op.model)
            return True
        self._generation += 1
        op.generation = self._generation
        self._live.add(op.generation)
        try:
            repo = self._write_files(op) if op.files else self.repo
            entry = self._read(op.model, op.config, repo)
            self._plan(op, entry)
        except ServingError as err:
            op.error = err
            op.parts, op.entries, op.ensemble = [], {}, None  # it staged nothing
            self._generation_gone(op.generation, out)
            return True
        touched = {op.model, *op.parts}
        if not self._claim(op, touched):
            op.blocked_by = touched
            op.parts, op.entries, op.ensemble = [], {}, None
            self._generation_gone(op.generation, out)  # its files: written again then
            op.started, op.generation = False, 0
            return False
        self.named.add(op.model)
        op.started_at = now
        for name in op.parts:
            out.start += self._stage(op, op.entries[name])
        self._spawned.add(op.generation)
        return True

    def _plan(self, op: Operation, entry: ModelEntry) -> None:
        """What ``op`` stages: the model, or an ensemble's composing models that are not
        loaded (then the ensemble, once they are)."""
        if not is_ensemble(entry.spec):  # type: ignore[arg-type]
            op.parts, op.entries = [op.model], {op.model: entry}
            return
        op.ensemble = entry
        for dep in dependencies(entry.spec):  # type: ignore[arg-type]
            loaded = self.table.models.get(dep.model)
            if (loaded is not None and loaded.versions) or dep.model in op.entries:
                continue
            part = self._read(dep.model, "")
            if is_ensemble(part.spec):  # type: ignore[arg-type]
                raise poll_failed(op.model, f"its composing ensemble '{dep.model}' is not loaded")
            op.parts.append(dep.model)
            op.entries[dep.model] = part

    def sweep_files(self) -> list[Path]:
        """Remove what loads of an earlier broker wrote in the runtime directory (configs,
        files): loads are numbered afresh, and a new one must not find an old one's files
        under its number. Called at start, before any load; returns what it removed."""
        removed = []
        for path in [*self.runtime_dir.glob("config-*.json"), *self.runtime_dir.glob("files-*")]:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
            removed.append(path)
        return removed

    def _write_files(self, op: Operation) -> Path:
        """A load's ``file:<version>/<path>`` parameters, written as a model directory of
        their own (Triton's): the repository it loads from. Its config must be given."""
        if not op.config:
            raise poll_failed(
                op.model, "the model's config ('config' parameter) must be given with its files"
            )
        root = self.runtime_dir / f"files-{op.generation}"
        self._written.setdefault(op.generation, []).append(root)
        model_dir = root / op.model
        for key, data in sorted(op.files.items()):
            rel = key.removeprefix("file:")
            if any(len(part.encode()) > 255 for part in Path(rel).parts):
                raise ServingError(
                    Code.INTERNAL,
                    f"failed to load '{op.model}', failed to poll from model repository: "
                    f"file name too long in '{key}'",
                )
            parts = load_file_parts(rel)
            if parts is None:
                raise poll_failed(op.model, f"invalid file path '{rel}': outside the model")
            path = model_dir.joinpath(*parts)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            except (OSError, ValueError) as exc:  # (ValueError: a NUL in the name)
                raise poll_failed(op.model, f"cannot write '{rel}': {exc}") from None
        model_dir.mkdir(parents=True, exist_ok=True)
        return root

    def _generation_gone(self, generation: int, out: Effects) -> None:
        """Once no version of a load is left: what it wrote is removed, and the launcher
        hears that none of its workers is to run (nor be restarted) any more."""
        if generation not in self._live:
            return
        staged = [v for e in self.table.models.values() for v in e.staged.values()]
        versions = [*self.table.all_versions(), *self.table.retiring, *staged]
        if any(mv.generation == generation for mv in versions):
            return
        self._live.discard(generation)
        if generation in self._spawned:
            self._spawned.discard(generation)
            out.gone.append(generation)
        for path in self._written.pop(generation, []):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()

    def _read(self, name: str, config: str, repo: Path | None = None) -> ModelEntry:
        """The model's entry as the repository (or the load's config) gives it now."""
        try:
            override = parse_config_json(config, name) if config else None
        except ConfigError as err:
            raise poll_failed(name, err.message) from None
        entry = repository.find(
            repo or self.repo,
            name,
            model_config_name=self.model_config_name,
            autocomplete_enabled=self.autocomplete,
            gpu_count=gpu_count(),
            config_override=override,
        )
        if entry is None:
            log.error("%s", not_in_repository(name))
            raise poll_failed(name)
        if entry.error and "at least one version must be available" in entry.error:
            raise ServingError(Code.INVALID_ARG, f"load failed for model '{name}': {entry.error}")
        if entry.error or entry.config is None:
            raise poll_failed(name, entry.error or "no config")
        return entry

    def _stage(self, op: Operation, entry: ModelEntry) -> list[m.WorkerSpec]:
        """Stage ``entry``'s versions as ``op``'s generation; the workers to start."""
        config = entry.spec
        assert config is not None
        others = [e for n, e in self.loaded.items() if n != entry.name]
        plans = plan_instances(
            [*loadable(others), (entry.name, entry.versions, config)],
            sorted(os.sched_getaffinity(0)),
        )
        kept = self._kept(op, entry)
        op.kept[entry.name] = kept
        if not op.files:
            given = entry.name == op.model and bool(op.config)
            op.stamps[entry.name] = self.stamps.read(entry, config_given=given)
        config_file = ""
        files_repo = ""
        if entry.name == op.model and op.config:  # the workers read it, not config.pbtxt
            path = self.runtime_dir / f"config-{entry.name}-{op.generation}.json"
            path.write_text(op.config)
            self._written.setdefault(op.generation, []).append(path)
            config_file = str(path)
        if entry.name == op.model and op.files:
            files_repo = str(self.runtime_dir / f"files-{op.generation}")
        count = instance_count(config)
        versions = [v for v in entry.versions if v not in kept]
        self.table.add_model(
            entry.name,
            {v: count for v in versions},
            config.platform or config.backend,
            passive_instances(config),
            generation=op.generation,
        )
        log.info(
            "loading %s version(s) %s (generation %d)%s",
            entry.name, ",".join(map(str, versions)) or "none", op.generation,
            f"; version(s) {','.join(map(str, sorted(kept)))} unmodified" if kept else "",
        )  # fmt: skip
        return [
            m.WorkerSpec(
                p.model,
                p.version,
                p.index,
                p.name,
                op.generation,
                list(p.cores),
                -1 if p.gpu is None else p.gpu,
                config_file,
                files_repo,
            )
            for p in plans
            if p.model == entry.name and p.version not in kept
        ]

    def _kept(self, op: Operation, entry: ModelEntry) -> set[int]:
        """The loaded versions of ``entry``'s model this load leaves as they are
        (shoal/broker/reuse.py); none for a load from a request's files, or of a model
        this load only brings along (an ensemble's composing model)."""
        loaded = self.loaded.get(entry.name)
        state = self.table.models.get(entry.name)
        if entry.name != op.model or op.files or loaded is None or state is None:
            return set()
        ready = {v for v, mv in state.versions.items() if mv.state == "READY"}
        return self.stamps.kept_versions(loaded, entry, ready)

    def _settle(self, op: Operation, now: float, out: Effects) -> bool:
        """Whether ``op`` is over (its outcome in ``op.error``)."""
        if op.action == "unload":
            return not any(mv.name in op.parts for mv in self.table.retiring)
        if op.error is None and op.cancelled:
            op.error = ServingError(
                Code.UNAVAILABLE, f"failed to load '{op.model}': an unload of it came first"
            )
        if op.error is None:
            for name in op.parts:
                entry = self.table.models.get(name)
                loading = [
                    v for v in (entry.staged if entry else {}).values() if v.state == "LOADING"
                ]
                if not loading:
                    continue
                if now - op.started_at < START_DEADLINE_S:
                    return False
                missing = [v for v in loading if len(v.instances) < v.expected_instances]
                if not missing:
                    return False  # its workers are loading the model: that takes its time
                for v in missing:
                    v.state = "UNAVAILABLE"
                    v.reason = f"its worker process did not start within {START_DEADLINE_S:g} s"
        failed = [
            v
            for name in op.parts
            if (entry := self.table.models.get(name)) is not None
            for v in entry.staged.values()
            if v.generation == op.generation and v.state != "READY"
        ]
        if op.error is None and failed:
            op.error = load_failed(failed[0].name, failed)
            for v in failed:  # a model not loaded before shows why (and is not ready)
                if v.name not in self.loaded:
                    self.unloaded.setdefault(v.name, {})[v.version] = v.reason
        if op.error is not None:
            self._discard(op, out)
            return True
        lost = [n for n in op.parts if not self._staged_by(op, n) and not op.kept.get(n)]
        if lost:  # (a bug: no one else touches what it claimed)
            op.error = ServingError(
                Code.INTERNAL, f"failed to load '{op.model}': {', '.join(lost)} not staged"
            )
            self._discard(op, out)
            return True
        for name in op.parts:
            self._commit(name, op.entries[name], out, op)
        if op.ensemble is not None:
            return self._settle_ensemble(op, out)
        return True

    def _staged_by(self, op: Operation, name: str) -> bool:
        entry = self.table.models.get(name)
        staged = entry.staged.values() if entry is not None else []
        return any(v.generation == op.generation for v in staged)

    def _commit(self, name: str, entry: ModelEntry, out: Effects, op: Operation) -> None:
        kept = op.kept.get(name, set())
        entry_state = self.table.models.get(name)
        if entry_state is None or not (entry_state.staged or kept):
            return
        old = self.table.commit(name, kept)
        self.loaded[name] = entry
        if name in op.stamps:
            self.stamps.of[name] = op.stamps[name]
        else:
            self.stamps.of.pop(name, None)
        gone = self.gone_versions.get(name, set()) | {mv.version for mv in old}
        self.gone_versions[name] = gone - set(entry_state.versions)
        self.unloaded.pop(name, None)  # what failed or was unloaded before is forgotten
        out.changed.add(name)
        log.info("successfully loaded '%s' (%d version(s) retire)", name, len(old))

    def _settle_ensemble(self, op: Operation, out: Effects) -> bool:
        """Stage the ensemble once its composing models are in (``ensembles``: the broker
        judges its steps against them, as at start); commit it once judged READY."""
        entry = op.ensemble
        assert entry is not None and entry.config is not None
        state = self.table.models.get(entry.name)
        staged = [] if state is None else [v for v in state.staged.values()]
        if not staged:
            config = entry.config_bytes()
            deps = dependencies(entry.spec)  # type: ignore[arg-type]
            out.ensembles += self.table.add_ensemble(
                entry.name, entry.versions, config, deps, generation=op.generation
            )
            op.parts = []  # the composing models are committed
            return False
        if any(v.state == "LOADING" for v in staged):
            return False
        bad = [v for v in staged if v.state != "READY"]
        if bad:
            op.error = load_failed(entry.name, bad)
            state.staged = {}  # type: ignore[union-attr]
            if entry.name not in self.loaded:
                del self.table.models[entry.name]
                self.unloaded[entry.name] = {v.version: v.reason for v in bad}
            self._generation_gone(op.generation, out)
            return True
        self._commit(entry.name, entry, out, op)
        return True

    def _discard(self, op: Operation, out: Effects) -> None:
        """A failed load: its staged versions retire; the loaded ones serve on."""
        for name in [*op.parts, *([op.ensemble.name] if op.ensemble is not None else [])]:
            entry = self.table.models.get(name)
            if entry is None:
                continue
            staged = [v for v in entry.staged.values() if v.generation == op.generation]
            entry.staged = {k: v for k, v in entry.staged.items() if v not in staged}
            self.table.retiring += [v for v in staged if v.instances]  # (workers to stop)
            if not entry.versions and not entry.staged and not entry.error:
                del self.table.models[name]  # not loaded before: it stays unloaded
        self._generation_gone(op.generation, out)
        log.error("%s", op.error.message if op.error else "load failed")

    def _composing_only(self, name: str) -> list[str]:
        """Unloading the ensemble ``name`` with its dependents (Triton's
        ``unload_dependents``): the composing models it loaded (not loaded by name) that no
        other loaded ensemble uses, and theirs in turn."""
        out: list[str] = []
        todo = [name]
        while todo:
            current = todo.pop()
            uses = {d.model for d in self._uses(current)}
            for dep in sorted(uses - {name, *out}):
                if dep in self.named or dep not in self.table.models:
                    continue
                users = {
                    e
                    for e in self.table.models
                    if e not in (name, *out) and dep in {d.model for d in self._uses(e)}
                }
                if not users:
                    out.append(dep)
                    todo.append(dep)
        return out

    def _uses(self, name: str) -> list[Dependency]:
        entry = self.table.models.get(name)
        if entry is None:
            return []
        return [d for mv in entry.versions.values() if mv.ensemble for d in mv.ensemble]

    def failures(self) -> bool:
        """A load failed and nothing has loaded since: Triton's server is not ready."""
        return any(
            r != "unloaded" for versions in self.unloaded.values() for r in versions.values()
        )

    def index(self) -> list[m.ModelState]:
        """The index entries of the repository's models that are not loaded (the loaded
        ones: ModelTable.states): by name alone, or each version it had, UNLOADING while
        one still drains. A model loaded from a request's files is not listed once
        unloaded: it has no directory in the repository (Triton's index)."""
        draining = {(v.name, v.version) for v in self.table.retiring}
        out = []
        failed = {n for n, vs in self.unloaded.items() if any(r != "unloaded" for r in vs.values())}
        # what the repository holds now, as Triton's; and any whose failed load keeps the
        # server from being ready (one loaded from a request's files has no directory)
        if self.view_sync is not None:
            self.view_sync.kick()  # (the bucket's changes: in the next index)
        try:
            names = repository.model_dirs(self.repo)
        except OSError:
            names = []
        for name, gone in sorted(self.gone_versions.items()):
            entry = self.table.models.get(name)
            shown = set(entry.versions) if entry is not None else set()
            out += [m.ModelState(name, v, "UNAVAILABLE", "unloaded") for v in sorted(gone - shown)]
        for name in sorted({*names, *failed}):
            if name in self.table.models:
                continue
            versions = self.unloaded.get(name, {})
            if not versions:
                out.append(m.ModelState(name, -1, ""))
            for v, reason in sorted(versions.items()):
                if (name, v) in draining and reason == "unloaded":
                    out.append(m.ModelState(name, v, "UNLOADING"))
                else:
                    out.append(m.ModelState(name, v, "UNAVAILABLE", reason))
        return out


def _reply(query_id: int, err: ServingError | None) -> m.ControlReply:
    if err is None:
        return m.ControlReply(query_id)
    return m.ControlReply(query_id, m.ErrorInfo(int(err.code), err.message))
