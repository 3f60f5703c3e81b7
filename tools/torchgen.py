"""TorchScript models for tests and examples (needs torch; the server imports this never).

``add_sub_model()``: ``forward(INPUT0, INPUT1) -> (INPUT0 + INPUT1, INPUT0 - INPUT1)``,
any shape and dtype that torch adds. ``crash_model()``: ``forward(INPUT0) -> INPUT0 * 2``
(one tensor), raising on a negative element. ``dict_add_model()``: ``forward(inputs)`` with
``inputs: Dict[str, Tensor]`` -> ``inputs["A"] + inputs["B"]``. ``sum_rows_model()``:
``forward(INPUT0) -> INPUT0.sum(0, keepdim=True)`` (a batch of n gives one row).
``spin_model()``: ``forward(INPUT0) -> INPUT0``, but loops forever inside TorchScript (native
code, where no Python signal handler runs) while any element is positive. Written as
``<repo>/<name>/<version>/model.pt`` with ``tools.modelgen.write_model(...,
filename="model.pt")``. ``shout_model()``: ``forward(TEXT: List[str], SCALE)`` ->
(each text upper-cased with "!" appended, as a List[str]; each text's length in bytes
times SCALE, an int64 tensor). ``grad_model()``: ``forward(INPUT0) -> 1`` per element where
it runs in inference mode, else 0.

PyTorch 2 archives (``model.pt2``): ``exported_add_sub()`` and ``exported_nested()`` are
ExportedPrograms saved by ``torch.export.save``; ``aoti_add_sub(folder)`` an AOTInductor
package.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Any

import torch


class AddSub(torch.nn.Module):
    def forward(
        self, INPUT0: torch.Tensor, INPUT1: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return INPUT0 + INPUT1, INPUT0 - INPUT1


class Crash(torch.nn.Module):
    """Raises inside forward when any input element is negative (a model-side error)."""

    def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:
        if bool((INPUT0 < 0).any()):
            raise RuntimeError("negative input")
        return INPUT0 * 2


class DictAdd(torch.nn.Module):
    """Takes its inputs as one Dict[str, Tensor] (Triton passes every input by name)."""

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["A"] + inputs["B"]


class SumRows(torch.nn.Module):
    """Sums over the batch dimension: an output that cannot be split among requests."""

    def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:
        return INPUT0.sum(0, keepdim=True)


class Spin(torch.nn.Module):
    """Hangs in native code on a positive element: a model stuck where signals wait."""

    def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:
        x = INPUT0
        while bool((x > 0).any()):
            x = x * 1
        return x


def _save(module: torch.nn.Module) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        # torch deprecates TorchScript in favour of torch.export; Triton's pytorch_libtorch
        # platform serves TorchScript, so that is what these models are.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(module), buf)
    return buf.getvalue()


def add_sub_model() -> bytes:
    return _save(AddSub())


def crash_model() -> bytes:
    return _save(Crash())


def dict_add_model() -> bytes:
    return _save(DictAdd())


def sum_rows_model() -> bytes:
    return _save(SumRows())


def spin_model() -> bytes:
    return _save(Spin())


class Shout(torch.nn.Module):
    def forward(self, TEXT: list[str], SCALE: torch.Tensor) -> tuple[list[str], torch.Tensor]:
        lengths = torch.tensor([len(t) for t in TEXT], dtype=torch.int64)
        return [t.upper() + "!" for t in TEXT], lengths * SCALE


def shout_model() -> bytes:
    return _save(Shout())


class TakesInt(torch.nn.Module):
    def forward(self, INPUT0: torch.Tensor, TIMES: int) -> torch.Tensor:
        return INPUT0 * TIMES


def takes_int_model() -> bytes:
    """``forward(INPUT0, TIMES: int)``: an argument Triton's PyTorch backend refuses."""
    return _save(TakesInt())


class Nested(torch.nn.Module):
    """Positional, dict and keyword inputs; a dict of a tensor and a pair out: the pytrees
    Triton's PT2 naming walks (ARGS[0], ARGS[1][k], KWARGS[scale]; RESULT[sum],
    RESULT[pair][0], RESULT[pair][1])."""

    def forward(
        self, x: torch.Tensor, opts: dict[str, torch.Tensor], *, scale: torch.Tensor
    ) -> dict[str, Any]:
        return {"sum": x + opts["k"], "pair": (x * scale, opts["k"] - x)}


class Grad(torch.nn.Module):
    """Answers 1 where it runs in inference mode, else 0: which of Triton's INFERENCE_MODE
    settings it ran under."""

    def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:
        made_here = INPUT0 * 0  # an inference tensor where inference mode is on
        return made_here + (1.0 if made_here.is_inference() else 0.0)


def grad_model() -> bytes:
    return _save(Grad())


def _export(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
            dynamic: Any) -> Any:  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return torch.export.export(module.eval(), args, kwargs, dynamic_shapes=dynamic)


def exported_add_sub(dynamic_batch: bool = True) -> bytes:
    """``AddSub`` as an ExportedProgram archive (``torch.export.save``): [batch, 4] inputs,
    the batch dynamic (up to 64) or fixed at 2."""
    batch = torch.export.Dim("batch", min=1, max=64)
    dims = ({0: batch}, {0: batch}) if dynamic_batch else None
    program = _export(AddSub(), (torch.ones(2, 4), torch.ones(2, 4)), {}, dims)
    buf = io.BytesIO()
    torch.export.save(program, buf)
    return buf.getvalue()


def exported_nested() -> bytes:
    """``Nested`` as an ExportedProgram archive: [batch, 3] tensors, the batch dynamic."""
    batch = torch.export.Dim("batch", min=1, max=64)
    x, k, scale = (torch.ones(2, 3) for _ in range(3))  # (one tensor for all: one input)
    program = _export(
        Nested(), (x, {"k": k}), {"scale": scale},
        {"x": {0: batch}, "opts": {"k": {0: batch}}, "scale": {0: batch}},
    )  # fmt: skip
    buf = io.BytesIO()
    torch.export.save(program, buf)
    return buf.getvalue()


def aoti_add_sub(folder: Path) -> bytes:
    """``AddSub`` compiled ahead of time by AOTInductor and packaged (Triton's
    ``torch_aoti``), [batch, 4] with a dynamic batch: needs a C++ compiler, and takes from
    seconds to a minute or more."""
    batch = torch.export.Dim("batch", min=1, max=64)
    program = _export(AddSub(), (torch.ones(2, 4), torch.ones(2, 4)), {}, ({0: batch}, {0: batch}))
    path = folder / "aoti_add_sub.pt2"
    torch._inductor.aoti_compile_and_package(program, package_path=str(path))
    return path.read_bytes()
