"""PyTorch 2 archives (``model.pt2``): an ExportedProgram saved by ``torch.export.save``, or
an AOTInductor package from ``torch._inductor.aoti_compile_and_package`` (Triton's
``torch_aoti``), told apart by what the archive holds.

Tensors are named as Triton's PyTorch backend names them for a PT2 archive, from the
program's call specification (its input and output pytrees), in either of two ways:

- by position among the flattened leaves: ``INPUT__<i>``, ``OUTPUT__<i>`` (a dict's
  leaves in its insertion order);
- by path: ``ARGS[<i>]`` for a positional argument, ``KWARGS[<key>]`` for a keyword one,
  ``RESULT`` for a lone output tensor and ``RESULT[<key or i>]...`` into what is returned,
  a ``[...]`` step per tuple, list or dict level (``ARGS[2][keyA]``, ``RESULT[BBB][0]``).

Every input leaf must be named by the config (after its ``batch_input`` targets); an
output may be any leaf. Leaves are tensors only, as in Triton.

A `Pt2Model` is used by one thread (the worker's); torch is imported here only.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from shoal.configs.schema import ConfigError


def _step(key: Any) -> str:
    for attr in ("idx", "key", "name"):  # SequenceKey, MappingKey, GetAttrKey
        if hasattr(key, attr):
            return f"[{getattr(key, attr)}]"
    return f"[{key}]"


def leaf_names(spec: Any, root: str) -> list[str]:
    """The path name of each leaf of ``spec`` in order; ``root`` "ARGS" names an input
    spec, whose top level is (args, kwargs)."""
    tree = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
    names = []
    for path, _ in pytree.tree_flatten_with_path(tree)[0]:
        steps = [_step(k) for k in path]
        if root == "ARGS":
            head = "ARGS" if steps[0] == "[0]" else "KWARGS"
            names.append(head + "".join(steps[1:]))
        else:
            names.append(root + "".join(steps))
    return names


class Pt2Model:
    def __init__(self, path: Path, device: torch.device) -> None:
        with zipfile.ZipFile(path) as archive:
            aoti = any("/data/aotinductor/" in n for n in archive.namelist())
        if aoti:
            index = device.index if device.type == "cuda" else -1
            runner = torch._inductor.aoti_load_package(str(path), device_index=index)
            in_spec, out_spec = (pytree.treespec_loads(s) for s in runner.loader.get_call_spec())
            self.kind = "AOTInductor package"
            self._fn: Any = runner
        else:
            program = torch.export.load(str(path))
            in_spec, out_spec = program.call_spec.in_spec, program.call_spec.out_spec
            self.kind = "ExportedProgram"
            self._fn = program.module().to(device)
        self._in_spec, self._out_spec = in_spec, out_spec
        self.inputs = leaf_names(in_spec, "ARGS")
        self.outputs = leaf_names(out_spec, "RESULT")
        self._feeds: list[str] = []  # config input name of each input leaf
        self._picks: dict[str, int] = {}  # config output name -> output leaf

    def bind(self, model: str, inputs: list[str], outputs: list[str]) -> None:
        """Match the config's tensor names to the program's leaves; raises ConfigError."""
        by_name = _names(self.inputs, "INPUT")
        if len(inputs) != len(self.inputs):
            raise ConfigError(
                model,
                f"unable to load model '{model}', configuration expects {len(inputs)} inputs, "
                f"model provides {len(self.inputs)}",
            )
        feeds: list[str | None] = [None] * len(self.inputs)
        for name in inputs:
            if name not in by_name:
                raise _unexpected(model, "input", name, self.inputs)
            feeds[by_name[name]] = name
        missing = [self.inputs[i] for i, f in enumerate(feeds) if f is None]
        if missing:
            raise ConfigError(
                model,
                f"unable to load model '{model}', no configuration input for "
                f"{', '.join(missing)} (each input is named once)",
            )
        out_names = _names(self.outputs, "OUTPUT")
        for name in outputs:
            if name not in out_names:
                raise ConfigError(
                    model,
                    f"The output {name} in the model configuration refers to an output "
                    f"which doesn't exist. This model's outputs are "
                    f"{', '.join(_both(self.outputs, 'OUTPUT'))}",
                )
        self._feeds = [f for f in feeds if f is not None]
        self._picks = {name: out_names[name] for name in outputs}

    def __call__(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """The program run on the named inputs: each bound output by its config name."""
        args, kwargs = pytree.tree_unflatten([tensors[n] for n in self._feeds], self._in_spec)
        leaves = pytree.tree_leaves(self._fn(*args, **kwargs))
        return {name: leaves[i] for name, i in self._picks.items() if i < len(leaves)}


def _names(paths: list[str], ordinal: str) -> dict[str, int]:
    return {
        **{p: i for i, p in enumerate(paths)},
        **{f"{ordinal}__{i}": i for i in range(len(paths))},
    }


def _both(paths: list[str], ordinal: str) -> list[str]:
    return [f"{p} ({ordinal}__{i})" for i, p in enumerate(paths)]


def _unexpected(model: str, kind: str, name: str, paths: list[str]) -> ConfigError:
    allowed = ", ".join(_both(paths, kind.upper()))
    return ConfigError(
        model,
        f"unable to load model '{model}', unexpected inference {kind} '{name}', allowed "
        f"{kind}s are: {allowed}",
    )
