"""PyTorch backend: TorchScript models (platform ``pytorch_libtorch``, ``model.pt``) and
PyTorch 2 archives (``model.pt2``, platform ``torch_aoti``: an ExportedProgram or an
AOTInductor package, named as shoal.workers.torch_pt2 says).

As Triton's PyTorch backend:

* A TorchScript file does not say what its tensors are, so the config must list every
  input and output with its data_type and dims (there is no auto-complete).
* Config inputs reach ``forward`` by the first rule that fits all of them: their names
  are ``forward``'s argument names; or they follow ``<name>__<index>`` (the index is the
  argument position); or config order. The config lists as many inputs as ``forward``
  takes, unless ``forward`` takes one ``Dict[str, Tensor]``: then it gets every input by
  name. The targets of ``batch_input`` count as inputs after the config's (Triton maps
  them so too). Outputs: ``<name>__<index>`` picks from the returned tuple, otherwise
  config order; a model returning one tensor has one output, and a model returning a dict is
  read by output name (a shoal extension). An output must have its config data type and
  at least one dimension, and an exception in ``forward`` fails the batch's requests
  with "PyTorch execute failure: ...", as in Triton.
* Threads: Triton's ``INTRA_OP_THREAD_COUNT`` and ``INTER_OP_THREAD_COUNT`` parameters,
  read as Triton reads them (a value that is not an integer fails the load). Without the
  first, shoal's lower-case ``intra_op_thread_count`` (an unparseable value is ignored,
  with a warning). A KIND_CPU instance gets the intra-op count the worker works out
  (``configs.backend_params.instance_threads``: by default one thread per core it owns); a
  KIND_GPU instance keeps torch's default intra-op pool.
* Triton's switches (shoal.configs.torch_params): ``INFERENCE_MODE`` (``torch.inference_mode``,
  else ``no_grad``), ``DISABLE_OPTIMIZED_EXECUTION``, ``ENABLE_JIT_PROFILING``,
  ``ENABLE_JIT_EXECUTOR``, ``ENABLE_TENSOR_FUSER`` (TorchScript's, process-wide: the process
  serves one model), ``DISABLE_CUDNN``, ``ENABLE_CACHE_CLEANING`` (GPU instances). A
  TorchScript switch set for a ``.pt2`` is logged as doing nothing there.

Inputs are wrapped, not copied: numpy views over shared memory become CPU tensors with
``torch.from_numpy``, and device arrays (client CUDA shared memory) become CUDA tensors
through DLPack. A KIND_GPU instance runs on ``cuda:0`` (the one GPU its process sees);
its outputs stay on the device, handed back as cupy arrays (DLPack again).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np
import torch

from shoal.configs.backend_params import torch_thread_params
from shoal.configs.model_spec import InputSpec, ModelSpec, OutputSpec
from shoal.configs.schema import IOSpec
from shoal.configs.torch_params import TorchExecParams, torch_exec_params
from shoal.ipc.errors import Code, ServingError, invalid_arg
from shoal.workers.torch_pt2 import Pt2Model

_TORCH_DTYPE: Final[dict[str, torch.dtype]] = {
    "BOOL": torch.bool, "UINT8": torch.uint8, "UINT16": torch.uint16,
    "UINT32": torch.uint32, "UINT64": torch.uint64, "INT8": torch.int8,
    "INT16": torch.int16, "INT32": torch.int32, "INT64": torch.int64,
    "FP16": torch.float16, "FP32": torch.float32, "FP64": torch.float64,
    "BF16": torch.bfloat16,
}  # fmt: skip
_TRITON_DTYPE: Final[dict[torch.dtype, str]] = {v: k for k, v in _TORCH_DTYPE.items()}
log = logging.getLogger("shoal.worker")
# torch.from_numpy of a read-only view (shared memory a frontend filled) warns once per
# process that writes would be undefined: the model only reads its inputs.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def _set_interop_threads(count: int) -> None:
    """Triton's INTER_OP_THREAD_COUNT (for every instance kind, as in Triton); 0 leaves
    torch's default. torch takes it once per process, before any inter-op work."""
    if count <= 0:
        return
    try:
        torch.set_num_interop_threads(count)
    except RuntimeError as exc:
        log.warning("INTER_OP_THREAD_COUNT %d not applied: %s", count, exc)


def _set_jit_switches(params: TorchExecParams) -> None:
    """TorchScript's process-wide switches, as Triton sets them around each execution (the
    worker's one model is the only user of this process's TorchScript)."""
    torch._C._set_graph_executor_optimize(params.optimized_execution)
    if params.jit_profiling is not None:
        torch._C._jit_set_profiling_mode(params.jit_profiling)
    if params.jit_executor is not None:
        torch._C._jit_set_profiling_executor(params.jit_executor)
    if params.tensor_fuser is not None:
        torch._C._jit_set_texpr_fuser_enabled(params.tensor_fuser)
    torch.backends.cudnn.enabled = params.cudnn


def _indices(names: list[str]) -> list[int] | None:
    """Each name's ``__<index>``, or None when not all follow the convention (Triton's
    rule: what follows the first ``__`` is all digits)."""
    parts = [n.partition("__") for n in names]
    if not all(sep and tail.isascii() and tail.isdigit() for _, sep, tail in parts):
        return None
    return [int(tail) for _, _, tail in parts]


class TorchBackend:
    def __init__(self) -> None:
        self._module: Any = None
        self._device = torch.device("cpu")
        self._arg_of: dict[str, int | str] = {}  # config input -> position or keyword
        self._dict_input = False  # forward(self, inputs: Dict[str, Tensor])
        self._out_index: dict[str, int] = {}  # config output -> position in the result
        self._out_dtype: dict[str, str] = {}  # config output -> its data type
        self._bf16: set[str] = set()
        self._pt2: Pt2Model | None = None
        self._exec = TorchExecParams()

    def load(self, model_file: Path, config: ModelSpec, threads: int, gpu: bool) -> None:
        if model_file.is_dir():
            model_file = model_file / "model.pt"
        self._check_config(config)
        if gpu:
            if not torch.cuda.is_available():
                raise RuntimeError(
                    "KIND_GPU instance, but this torch build sees no CUDA device "
                    f"(torch {torch.__version__})"
                )
            self._device = torch.device("cuda", 0)
        elif threads > 0:
            torch.set_num_threads(threads)
        _set_interop_threads(torch_thread_params(config).inter_op_threads)
        self._exec = torch_exec_params(config)
        if model_file.suffix == ".pt2":
            self._load_pt2(model_file, config)
            return
        _set_jit_switches(self._exec)
        module = torch.jit.load(str(model_file), map_location=self._device)
        module.eval()
        self._module = module
        self._map_inputs(config, module)
        self._map_outputs(config)

    def _load_pt2(self, model_file: Path, config: ModelSpec) -> None:
        exec_params = self._exec
        jit = [
            key
            for key, value in (
                ("DISABLE_OPTIMIZED_EXECUTION", not exec_params.optimized_execution),
                ("ENABLE_TENSOR_FUSER", exec_params.tensor_fuser is not None),
                ("ENABLE_JIT_PROFILING", exec_params.jit_profiling is not None),
                ("ENABLE_JIT_EXECUTOR", exec_params.jit_executor is not None),
            )
            if value
        ]
        if jit:
            log.warning(
                "model '%s': %s tune(s) TorchScript, not a PyTorch 2 archive; nothing done",
                config.name, ", ".join(jit),
            )  # fmt: skip
        torch.backends.cudnn.enabled = exec_params.cudnn
        try:
            program = Pt2Model(model_file, self._device)
        except Exception as exc:
            raise ValueError(
                f"unable to load model '{config.name}': {model_file.name} is neither an "
                f"ExportedProgram nor an AOTInductor package this torch can load "
                f"({type(exc).__name__}: {exc})"
            ) from None
        names = [io.name for io in config.inputs]
        names += [target for bi in config.batch_inputs for target in bi.target_names]
        program.bind(config.name, names, [io.name for io in config.outputs])
        log.info(
            "model '%s': %s with inputs %s and outputs %s",
            config.name, program.kind, ", ".join(program.inputs), ", ".join(program.outputs),
        )  # fmt: skip
        self._pt2 = program
        self._module = program

    def _check_config(self, config: ModelSpec) -> None:
        name = config.name
        tensors: list[InputSpec | OutputSpec] = [*config.inputs, *config.outputs]
        missing = [
            io.name
            for io in tensors
            if io.datatype == "INVALID" or (not io.dims and io.reshape is None)
        ]
        if not config.inputs or not config.outputs or missing:
            raise ValueError(
                f"model '{name}': a TorchScript model does not describe its tensors, so its "
                "config must list every input and output with data_type and dims"
                + (f" (incomplete: {', '.join(missing)})" if missing else "")
            )
        ins, outs = _io_specs(config)
        for spec in [*ins, *outs]:
            if spec.datatype == "BYTES":
                raise ValueError(
                    f"model '{name}': {spec.name} is TYPE_STRING, which shoal's PyTorch "
                    "backend does not support"
                )
        self._bf16 = {spec.name for spec in [*ins, *outs] if spec.datatype == "BF16"}
        self._out_dtype = {spec.name: spec.datatype for spec in outs}

    def _map_inputs(self, config: ModelSpec, module: Any) -> None:
        names = [io.name for io in config.inputs]
        names += [target for bi in config.batch_inputs for target in bi.target_names]
        params = module.forward.schema.arguments[1:]  # without self
        if len(params) == 1 and params[0].type.kind() == "DictType":
            self._dict_input = True
            return
        if len(params) != len(names):
            raise ValueError(
                f"unable to load model '{config.name}', configuration expects {len(names)} "
                f"inputs, model provides {len(params)}"
            )
        args = [a.name for a in params]
        if all(n in args for n in names):
            self._arg_of = {n: n for n in names}
            return
        indices = _indices(names)
        if indices is not None:
            if sorted(indices) != list(range(len(names))):
                raise ValueError(
                    f"model '{config.name}': input indices {sorted(indices)} must be "
                    f"0..{len(names) - 1}, each once"
                )
            self._arg_of = dict(zip(names, indices, strict=True))
            return
        self._arg_of = {n: i for i, n in enumerate(names)}

    def _map_outputs(self, config: ModelSpec) -> None:
        names = [io.name for io in config.outputs]
        indices = _indices(names)
        self._out_index = dict(zip(names, indices or range(len(names)), strict=True))

    def io_spec(self) -> None:
        """None: the model file does not describe its tensors; the config does."""
        return None

    def execute(
        self,
        inputs: Mapping[str, Any],
        outputs: list[str],
        destinations: Mapping[str, Any] | None = None,  # torch allocates its outputs
    ) -> list[Any]:
        assert self._module is not None
        tensors = {name: self._tensor(name, arr) for name, arr in inputs.items()}
        try:
            with torch.inference_mode(self._exec.inference_mode), torch.no_grad():
                result = self._run(tensors)
        except Exception as exc:
            raise ServingError(Code.INTERNAL, f"PyTorch execute failure: {exc}") from exc
        finally:
            if self._exec.cache_cleaning and self._device.type == "cuda":
                torch.cuda.empty_cache()
        return [self._array(name, self._pick(result, name)) for name in outputs]

    def _run(self, tensors: dict[str, torch.Tensor]) -> Any:
        if self._pt2 is not None:
            return self._pt2(tensors)  # a dict: each bound output by its config name
        args: list[Any] = [None] * sum(1 for v in self._arg_of.values() if isinstance(v, int))
        kwargs: dict[str, Any] = {}
        if self._dict_input:
            args = [tensors]
        for name, tensor in tensors.items():
            where = self._arg_of.get(name)
            if isinstance(where, str):
                kwargs[where] = tensor
            elif where is not None:
                args[where] = tensor
        return self._module(*args, **kwargs)

    def _tensor(self, name: str, arr: Any) -> torch.Tensor:
        if name in self._bf16:
            arr = arr.view("int16")  # bfloat16 bit patterns (uint16 on the wire)
        if hasattr(arr, "__cuda_array_interface__"):
            t = torch.from_dlpack(arr)  # the client's device memory itself
        else:
            # (np.ascontiguousarray would turn a 0-d input into a 1-d one)
            t = torch.from_numpy(arr if arr.flags.c_contiguous else np.ascontiguousarray(arr))
        if name in self._bf16:
            t = t.view(torch.bfloat16)
        return t.to(self._device)

    def _pick(self, result: Any, name: str) -> torch.Tensor:
        if isinstance(result, dict):
            if name not in result:
                raise invalid_arg(f"the model returned no output '{name}'")
            value = result[name]
        else:
            results = result if isinstance(result, list | tuple) else [result]
            index = self._out_index[name]
            if index >= len(results):
                raise invalid_arg(
                    f"The output {name} in the model configuration refers to an output index "
                    f"which doesn't exist. This model has {len(results)} outputs"
                )
            value = results[index]
        if not isinstance(value, torch.Tensor):
            raise invalid_arg(f"output '{name}' is a {type(value).__name__}, not a tensor")
        if value.dim() == 0:
            raise invalid_arg(f"output '{name}' is a scalar which is not supported.")
        want = self._out_dtype[name]
        if value.dtype != _TORCH_DTYPE[want]:
            got = _TRITON_DTYPE.get(value.dtype, str(value.dtype).removeprefix("torch."))
            raise invalid_arg(
                f"configuration expects datatype TYPE_{want} for output '{name}', model "
                f"provides TYPE_{got}"
            )
        return value

    def _array(self, name: str, t: torch.Tensor) -> Any:
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        t = t.contiguous()
        if t.is_cuda:
            import cupy

            torch.cuda.current_stream().synchronize()  # done before anyone reads it
            arr = cupy.from_dlpack(t)
            return arr.view(cupy.uint16) if name in self._bf16 else arr
        out = t.numpy()
        return out.view(np.uint16) if name in self._bf16 else out

    def unload(self) -> None:
        self._module = None


def _io_specs(config: ModelSpec) -> tuple[list[IOSpec], list[IOSpec]]:
    """The config's inputs and outputs as IOSpecs, batch dimension (-1) included."""
    batch = [-1] if config.max_batch_size > 0 else []
    return (
        [IOSpec(io.name, io.datatype, batch + list(io.dims)) for io in config.inputs],
        [IOSpec(io.name, io.datatype, batch + list(io.dims)) for io in config.outputs],
    )
