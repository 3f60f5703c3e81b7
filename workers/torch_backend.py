"""PyTorch backend: TorchScript models (platform ``pytorch_libtorch``, ``model.pt``).

As Triton's PyTorch backend:

* A TorchScript file does not say what its tensors are, so the config must list every
  input and output with its data_type and dims (there is no auto-complete).
* Config inputs reach ``forward`` by the first rule that fits all of them: their names
  are ``forward``'s argument names; or they follow ``<name>__<index>`` (the index is the
  argument position); or config order. Outputs: ``<name>__<index>`` picks from the
  returned tuple, otherwise config order; a model returning one tensor has one output,
  and a model returning a dict is read by output name.

Inputs are wrapped, not copied: numpy views over shared memory become CPU tensors with
``torch.from_numpy``, and device arrays (client CUDA shared memory) become CUDA tensors
through DLPack. A KIND_GPU instance runs on ``cuda:0`` (the one GPU its process sees);
its outputs stay on the device, handed back as cupy arrays (DLPack again).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from configs.model_config import io_specs
from ipc.errors import invalid_arg

_NAMED_INDEX = re.compile(r"^.+__(\d+)$")
# torch.from_numpy of a read-only view (shared memory a frontend filled) warns once per
# process that writes would be undefined: the model only reads its inputs.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def _indices(names: list[str]) -> list[int] | None:
    """Each name's ``__<index>``, or None when not all follow the convention."""
    found = [_NAMED_INDEX.match(n) for n in names]
    if not all(found):
        return None
    return [int(f.group(1)) for f in found if f is not None]


class TorchBackend:
    def __init__(self) -> None:
        self._module: Any = None
        self._device = torch.device("cpu")
        self._arg_of: dict[str, int | str] = {}  # config input -> position or keyword
        self._out_index: dict[str, int] = {}  # config output -> position in the result
        self._bf16: set[str] = set()

    def load(self, model_file: Path, config: Any, threads: int, gpu: bool) -> None:
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
        module = torch.jit.load(str(model_file), map_location=self._device)
        module.eval()
        self._module = module
        self._map_inputs(config, module)
        self._map_outputs(config)

    def _check_config(self, config: Any) -> None:
        name = config.name
        missing = [
            io.name
            for io in [*config.input, *config.output]
            if not io.data_type or (not io.dims and not io.HasField("reshape"))
        ]
        if not config.input or not config.output or missing:
            raise ValueError(
                f"model '{name}': a TorchScript model does not describe its tensors, so its "
                "config must list every input and output with data_type and dims"
                + (f" (incomplete: {', '.join(missing)})" if missing else "")
            )
        ins, outs = io_specs(config)
        for spec in [*ins, *outs]:
            if spec.datatype == "BYTES":
                raise ValueError(
                    f"model '{name}': {spec.name} is TYPE_STRING, which shoal's PyTorch "
                    "backend does not support"
                )
        self._bf16 = {spec.name for spec in [*ins, *outs] if spec.datatype == "BF16"}

    def _map_inputs(self, config: Any, module: Any) -> None:
        names = [io.name for io in config.input]
        args = [a.name for a in module.forward.schema.arguments][1:]  # without self
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

    def _map_outputs(self, config: Any) -> None:
        names = [io.name for io in config.output]
        indices = _indices(names)
        self._out_index = dict(zip(names, indices or range(len(names)), strict=True))

    def io_spec(self) -> None:
        """None: the model file does not describe its tensors; the config does."""
        return None

    def execute(self, inputs: Mapping[str, Any], outputs: list[str]) -> list[Any]:
        assert self._module is not None
        args: list[Any] = [None] * sum(1 for v in self._arg_of.values() if isinstance(v, int))
        kwargs: dict[str, Any] = {}
        for name, arr in inputs.items():
            tensor = self._tensor(name, arr)
            where = self._arg_of.get(name)
            if isinstance(where, str):
                kwargs[where] = tensor
            elif where is not None:
                args[where] = tensor
        with torch.inference_mode():
            result = self._module(*args, **kwargs)
        return [self._array(name, self._pick(result, name)) for name in outputs]

    def _tensor(self, name: str, arr: Any) -> torch.Tensor:
        if name in self._bf16:
            arr = arr.view("int16")  # bfloat16 bit patterns (uint16 on the wire)
        if hasattr(arr, "__cuda_array_interface__"):
            t = torch.from_dlpack(arr)  # the client's device memory itself
        else:
            t = torch.from_numpy(np.ascontiguousarray(arr))
        if name in self._bf16:
            t = t.view(torch.bfloat16)
        return t.to(self._device)

    def _pick(self, result: Any, name: str) -> torch.Tensor:
        if isinstance(result, dict):
            if name not in result:
                raise invalid_arg(f"the model returned no output '{name}'")
            value = result[name]
        elif isinstance(result, list | tuple):
            index = self._out_index[name]
            if index >= len(result):
                raise invalid_arg(
                    f"output '{name}' is result {index}, but the model returned {len(result)}"
                )
            value = result[index]
        else:
            value = result
        if not isinstance(value, torch.Tensor):
            raise invalid_arg(f"output '{name}' is a {type(value).__name__}, not a tensor")
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
