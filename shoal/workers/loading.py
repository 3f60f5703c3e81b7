"""Loading one model instance: what a worker is told to load (``WorkerSettings``), its config
found and completed, its backend loaded with its thread count, the helpers its batches need
(batch I/O, a stateful model's sequence I/O, classification labels), and its warm-up.

No sockets: the worker (shoal/workers/proc.py) reports the outcome to the broker. A Python
model's scripting client (shoal/workers/bls.py), which does open sockets, is made by the
caller's ``start_scripting``, and only for that backend.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal.configs import autocomplete as ac
from shoal.configs import repository
from shoal.configs.backend_params import (
    ParamSource,
    borrowing_threads,
    instance_threads,
    ort_session_params,
    torch_thread_params,
)
from shoal.configs.devices import gpu_count
from shoal.configs.model_config import (
    ConfigError,
    config_to_json,
    parse_config_json,
    validate_io,
)
from shoal.configs.model_spec import ModelSpec
from shoal.configs.placement import passive_instances
from shoal.configs.spec_reader import read_spec
from shoal.dataplane import classification
from shoal.workers import backend as backends
from shoal.workers import python_env, warmup
from shoal.workers.batch_io import BatchAssembler
from shoal.workers.sequence_io import SequenceIO

log = logging.getLogger("shoal.worker")


@dataclass
class WorkerSettings:
    model_repository: Path
    model: str
    version: int
    instance: int
    runtime_dir: Path
    autocomplete: bool = True
    model_config_name: str = ""
    default_max_batch_size: int = 4
    load_retries: int = 0  # more tries of a load that fails (--model-load-retry-count)
    cores: list[int] = field(default_factory=list)
    gpu: int | None = None
    gpu_count: int | None = None  # the server's GPUs (this process sees only its own)
    instance_name: str = ""
    generation: int = 0  # the load it belongs to (model control)
    config_override: Path | None = None  # a load's JSON config, replacing config.pbtxt
    fault: str = ""  # SHOAL_TEST_FAULT's action, for tests only (see shoal/workers/__main__.py)
    may_use: int = 0  # cores it may run on while idle instances lend theirs (0: its own)
    env_error: str = ""  # why its Python model's EXECUTION_ENV_PATH cannot be used


@dataclass
class LoadedModel:
    """A model loaded and warmed up, with what its batches need (read-only once made)."""

    backend: backends.Backend
    spec: ModelSpec  # completed (auto-complete, a Python model's own)
    threads: int  # intra-op threads its backend was given (WorkerReady.threads)
    assembler: BatchAssembler
    sequence: SequenceIO | None = None  # a stateful model's controls and state
    labels: dict[str, list[str]] = field(default_factory=dict)  # per output (label_filename)
    output_types: dict[str, str] = field(default_factory=dict)  # per output, its V2 datatype
    # Outputs whose shape is known before the run (fixed dims, no reshape, not split by an
    # input's shape): a lone request's may be written in place.
    output_dims: dict[str, list[int]] = field(default_factory=dict)
    config_bytes: bytes = b""  # the completed config, serialized (WorkerReady.config)

    @classmethod
    def of(
        cls,
        backend: backends.Backend,
        spec: ModelSpec,
        threads: int,
        assembler: BatchAssembler,
        sequence: SequenceIO | None = None,
        labels: dict[str, list[str]] | None = None,
        config_bytes: bytes = b"",
    ) -> LoadedModel:
        """The loaded model, with the outputs' types and known shapes read from ``spec``."""
        output_dims = {
            o.name: list(o.dims)
            for o in spec.outputs
            if o.reshape is None
            and all(d >= 0 for d in o.dims)
            and o.name not in assembler.scatter_specs
        }
        output_types = {o.name: o.datatype for o in spec.outputs}
        return cls(
            backend,
            spec,
            threads,
            assembler,
            sequence,
            labels or {},
            output_types,
            output_dims,
            config_bytes,
        )


def load(s: WorkerSettings, start_scripting: Callable[[], object]) -> LoadedModel:
    """Find, complete and load the model ``s`` names, then warm it up; raises on any
    failure (ConfigError with its message, or whatever the backend raised)."""
    if s.env_error:
        raise ConfigError(s.model, s.env_error)
    override = None
    if s.config_override is not None:
        override = parse_config_json(s.config_override.read_text(), s.model)
    entry = repository.find(
        s.model_repository,
        s.model,
        model_config_name=s.model_config_name,
        autocomplete_enabled=s.autocomplete,
        gpu_count=s.gpu_count if s.gpu_count is not None else gpu_count(),
        config_override=override,
    )
    if entry is None or entry.error or entry.config is None:
        reason = entry.error if entry is not None else "no such model directory"
        raise ConfigError(s.model, reason or "no config")
    config = entry.config
    backend_name = config.backend or "onnxruntime"
    backend = backends.create(backend_name)
    if backend_name == "python":  # its model may call other models
        model_dir = s.model_repository / s.model  # (as the worker's start read it)
        python_env.check(s.model, model_dir, s.config_override, s.model_config_name)
        start_scripting()
    backend.instance_name = s.instance_name  # type: ignore[attr-defined]  # (Python's)
    backend.instance = s.instance  # type: ignore[attr-defined]  # (TensorRT's, identity's)
    backend.gpu = s.gpu is not None  # type: ignore[attr-defined]  # (TensorRT's auto-complete)
    backend.default_max_batch_size = s.default_max_batch_size  # type: ignore[attr-defined]
    model_file = entry.model_file(s.version)
    if s.autocomplete and hasattr(backend, "auto_complete"):  # a Python model's own
        config = backend.auto_complete(model_file, config)
    weight = files_bytes(model_file) if s.may_use > len(s.cores) else 0
    threads = thread_count(config, backend_name, s.cores, s.may_use, weight)
    if backend_name == "python":  # its model.py reads the config's JSON form
        backend.model_config = config_to_json(config)  # type: ignore[attr-defined]
    backend.load(model_file, read_spec(config), threads, s.gpu is not None)
    specs = backend.io_spec()
    model_ins: set[str] | None = None
    model_outs: set[str] | None = None
    if specs is not None:
        ins, outs = specs
        model_ins, model_outs = {i.name for i in ins}, {o.name for o in outs}
        if s.autocomplete:
            config = ac.autocomplete(
                config, ins, outs, default_max_batch_size=s.default_max_batch_size
            )
        ac.check_against_model(config, ins, outs)
    validate_io(config)
    spec = read_spec(config)
    assembler = BatchAssembler.from_config(spec)
    if hasattr(backend, "batch_outputs"):  # (identity's: its ragged inputs' outputs)
        assembler.scatter_specs.update(backend.batch_outputs(spec))
    sequence = SequenceIO.from_config(spec, entry.path, model_ins, model_outs)
    labels = classification.labels_of(spec, entry.path)
    if s.instance not in passive_instances(spec):  # Triton warms these alone
        warm_up(s.instance, spec, entry.path, backend, assembler, sequence)
    config_bytes = config.SerializeToString()
    return LoadedModel.of(backend, spec, threads, assembler, sequence, labels, config_bytes)


def warm_up(
    instance: int,
    config: ModelSpec,
    model_dir: Path,
    backend: backends.Backend,
    assembler: BatchAssembler,
    sequence: SequenceIO | None,
) -> None:
    """The config's model_warmup samples (shoal/workers/warmup.py), a sequence model's with
    its control tensors and initial state; raises ConfigError."""

    def gather(feeds: list[dict[str, Any]]) -> dict[str, Any]:
        if sequence is not None:
            feeds = [sequence.warmup_row(f) for f in feeds]
        return assembler.gather(feeds)

    for sample in warmup.samples(config, model_dir):
        seconds = warmup.run(
            config,
            sample,
            lambda feeds, outputs: backend.execute(feeds, outputs, None),
            gather,
        )
        log.info(
            "instance %d warmed up with sample '%s' (batch %d, %d time(s)) in %.0f ms",
            instance, sample.name, sample.batch_size, sample.count, seconds * 1000,
        )  # fmt: skip


def thread_count(
    config: ParamSource, backend: str, cores: list[int], may_use: int = 0, model_bytes: int = 0
) -> int:
    """Intra-op threads for the backend: what the config's parameters ask for, as that
    backend reads them (shoal.configs.backend_params), sized by `instance_threads`: one per core
    this instance owns when they ask nothing, and its core count for "the backend's
    default" (<= 0), so that the pool stays on its cores. An ONNX Runtime instance that
    may borrow idle instances' cores (``may_use``) and whose model is large enough (its
    files' ``model_bytes``) gets
    threads for them (`borrowing_threads`). Raises ConfigError, which fails the load, for
    a value Triton rejects, the first in Triton's order."""
    requested = None
    if backend == "onnxruntime":
        requested = ort_session_params(config).intra_op_threads
        return borrowing_threads(requested, cores, may_use, model_bytes)
    if backend == "pytorch":
        params = torch_thread_params(config)
        for key, value in params.ignored:
            log.warning(
                "model '%s': parameter %s '%s' is not an integer; ignored", config.name, key, value
            )
        requested = params.intra_op_threads
    return instance_threads(requested, cores)


def files_bytes(model_file: Path) -> int:
    """The size of the files beside ``model_file`` (external weights included)."""
    folder = model_file if model_file.is_dir() else model_file.parent
    with contextlib.suppress(OSError):
        return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    return 0
