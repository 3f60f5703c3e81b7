"""Triton's ``model_warmup``: samples each instance runs before it reports ready.

A Triton user lists warmup samples so that the first client request does not pay for
the backend's lazy start (ONNX Runtime's first run, a GPU's kernels and memory pools),
and so that a model that cannot run fails its load instead of its first request. shoal
runs them as Triton 2.51's core does (backend_model_instance.cc, GenerateWarmupData and
WarmUp):

- in each instance that may be sent requests (not passive ones), after the model is
  loaded and before the instance reports ready, the samples in config order;
- a sample with ``batch_size`` 0 is skipped; otherwise it is ``batch_size`` requests of
  one sample each (``[1, *dims]`` for a model that batches), executed together as one
  batch, ``count`` times (at least once);
- each input's data is zeros (``zero_data``), random bytes (``random_data``; zeros for
  BYTES, whose elements are then empty), or the bytes of ``input_data_file`` in the
  model's ``warmup/`` folder (for BYTES, the whole file as length-prefixed elements;
  otherwise its first bytes, which must be enough);
- every output is computed and dropped; the statistics do not count warmup.

A sample that cannot be built or run fails the instance's load ("failed to run warmup
sample 'x': ...", Triton's words where they are its core's): the model is UNAVAILABLE
with that reason.
Beyond Triton: a sample's inputs are checked against the model's inputs first (names,
data types, shapes), and an ``input_data_file`` must not lead out of the model
repository. Where Triton repeats a backend's error once per request of the sample,
shoal says it once.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from shoal.configs.model_spec import ModelSpec, WarmupInput
from shoal.configs.schema import ConfigError
from shoal.ipc import bytes_tensors, datatypes

log = logging.getLogger("shoal.worker")

#: Triton's kWarmupDataFolder: where ``input_data_file`` names a file.
WARMUP_FOLDER: Final = "warmup"


@dataclass(frozen=True)
class Sample:
    name: str
    batch_size: int
    count: int
    request: dict[str, np.ndarray]  # one request's inputs, as the model receives them


def _dims(dims: list[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _data(
    config: ModelSpec, model_dir: Path, name: str, spec: WarmupInput, rng: np.random.Generator
) -> np.ndarray:
    """One request's tensor for warmup input ``name``."""
    datatype = spec.datatype
    dt = datatypes.datatype(datatype)
    assert dt is not None  # every ModelConfig data type has one
    dims = list(spec.dims)
    count = datatypes.element_count(dims)
    which = spec.source
    if which is None:
        raise ConfigError(
            config.name, f"warmup setting expects input '{name}' to have input_data_type set"
        )
    if dt.numpy is None:  # BYTES: zero and random data are empty elements
        if which == "input_data_file":
            raw = _read(config, model_dir, name, spec.input_data_file)
            try:
                lengths = datatypes.check_bytes_layout(raw, count, name, config.name)
            except datatypes.BytesLayoutError as exc:
                raise ConfigError(config.name, exc.message) from None
            return bytes_tensors.unpack(raw, lengths).reshape(dims)
        return np.full(count, b"", dtype=object).reshape(dims)
    nbytes = count * dt.itemsize
    if which == "zero_data":
        return np.zeros(dims, dtype=dt.numpy)
    if which == "random_data":
        if datatype == "BOOL":  # a numpy bool must hold 0 or 1
            return rng.integers(0, 2, size=dims).astype(np.bool_)
        raw_random = rng.integers(0, 256, size=nbytes, dtype=np.uint8).tobytes()
        return np.frombuffer(raw_random, dtype=dt.numpy).reshape(dims).copy()
    raw = _read(config, model_dir, name, spec.input_data_file)
    if len(raw) < nbytes:
        raise ConfigError(
            config.name,
            f"warmup setting expects {nbytes} bytes, but the data provided from "
            f"{spec.input_data_file} only has {len(raw)} bytes",
        )
    return np.frombuffer(raw[:nbytes], dtype=dt.numpy).reshape(dims).copy()


def _read(config: ModelSpec, model_dir: Path, name: str, file: str) -> bytes:
    # Read as the path is written (a symlink to shared data is followed, as Triton does),
    # but not from outside the model repository: "../../etc/shadow" is no warmup data.
    path = Path(os.path.normpath(model_dir / WARMUP_FOLDER / file))
    if not path.is_relative_to(os.path.normpath(model_dir.parent)):
        raise ConfigError(
            config.name,
            f"warmup input_data_file '{file}' for input '{name}' is outside the model repository",
        )
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            config.name,
            f"failed to read warmup data for input '{name}' from "
            f"{WARMUP_FOLDER}/{file}: {exc.strerror or exc}",
        ) from None


def samples(config: ModelSpec, model_dir: Path, seed: int | None = None) -> list[Sample]:
    """The config's warmup samples with their data, checked against the model's inputs.
    Raises ConfigError with what is wrong."""
    rng = np.random.default_rng(seed)
    inputs = {i.name: i for i in config.inputs}
    batching = config.max_batch_size > 0
    out: list[Sample] = []
    for w in config.model_warmup:
        if w.batch_size == 0:
            log.debug("skipping batch 0 warmup sample '%s'", w.name)
            continue
        request: dict[str, np.ndarray] = {}
        for spec in w.inputs:
            name = spec.name
            if any(d < 0 for d in spec.dims):
                raise ConfigError(
                    config.name,
                    "warmup setting expects all variable-size dimensions are specified for "
                    f"input '{name}'",
                )
            want = inputs.get(name)
            if want is None:
                raise ConfigError(
                    config.name, f"unexpected inference input '{name}' for model '{config.name}'"
                )
            if spec.datatype != want.datatype:
                raise ConfigError(
                    config.name,
                    f"inference input '{name}' data-type is '{spec.datatype}', "
                    f"but model '{config.name}' expects '{want.datatype}'",
                )
            dims = list(spec.dims)
            if len(dims) != len(want.dims) or any(
                c != -1 and c != d for c, d in zip(want.dims, dims, strict=True)
            ):
                full = [-1, *want.dims] if batching else list(want.dims)
                got = [1, *dims] if batching else dims
                raise ConfigError(
                    config.name,
                    f"unexpected shape for input '{name}' for model '{config.name}'. "
                    f"Expected {_dims(full)}, got {_dims(got)}",
                )
            arr = _data(config, model_dir, name, spec, rng)
            if want.reshape is not None:
                arr = arr.reshape(list(want.reshape))
            request[name] = arr[np.newaxis] if batching else arr
        missing = [i.name for i in config.inputs if i.name not in request and not i.optional]
        if missing:
            raise ConfigError(
                config.name,
                f"warmup sample '{w.name}' is missing required input(s) "
                + ", ".join(f"'{n}'" for n in missing)
                + f" of model '{config.name}'",
            )
        out.append(Sample(w.name, w.batch_size, max(w.count, 1), request))
    return out


def run(
    config: ModelSpec,
    sample: Sample,
    execute: Callable[[Mapping[str, Any], list[str]], list[Any]],
    gather: Callable[[list[dict[str, Any]]], dict[str, Any]],
) -> float:
    """Run ``sample`` ``count`` times as one batch of ``batch_size`` requests; returns
    the seconds it took. Raises ConfigError ("failed to run warmup sample ...")."""
    batch = sample.batch_size
    limit = config.max_batch_size
    if batch != 1 and batch > limit:  # the check Triton's backends make on a batch
        raise ConfigError(
            config.name,
            f"failed to run warmup sample '{sample.name}': batch size {batch} for "
            f"'{config.name}', max allowed is {limit}; ",
        )
    outputs = sorted(o.name for o in config.outputs)
    feeds = gather([sample.request] * batch)
    t0 = time.monotonic()
    for _ in range(sample.count):
        try:
            execute(feeds, outputs)
        except Exception as exc:
            message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            raise ConfigError(
                config.name, f"failed to run warmup sample '{sample.name}': {message}; "
            ) from None
    return time.monotonic() - t0
