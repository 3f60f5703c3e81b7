"""TorchScript models for tests and examples (needs torch; the server imports this never).

``add_sub_model()``: ``forward(INPUT0, INPUT1) -> (INPUT0 + INPUT1, INPUT0 - INPUT1)``,
any shape and dtype that torch adds. ``crash_model()``: ``forward(INPUT0) -> INPUT0 * 2``
(one tensor), raising on a negative element. ``dict_add_model()``: ``forward(inputs)`` with
``inputs: Dict[str, Tensor]`` -> ``inputs["A"] + inputs["B"]``. ``sum_rows_model()``:
``forward(INPUT0) -> INPUT0.sum(0, keepdim=True)`` (a batch of n gives one row).
``spin_model()``: ``forward(INPUT0) -> INPUT0``, but loops forever inside TorchScript (native
code, where no Python signal handler runs) while any element is positive. Written as
``<repo>/<name>/<version>/model.pt`` with ``tools.modelgen.write_model(...,
filename="model.pt")``.
"""

from __future__ import annotations

import io
import warnings

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
