"""The errors of ``triton_python_backend_utils`` (shoal/workers/pb_utils.py, which exports
them): ``TritonModelException``, which a model raises and catches, ``TritonError``, a
response's error, and ``expect``, the argument check its functions share."""

from __future__ import annotations

from typing import Any


class TritonModelException(Exception):
    """What a Python model raises; the requests of its batch fail with the message."""

    def message(self) -> str:
        return str(self)


class TritonError:
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


def expect(where: str, arg: str, value: Any, types: type | tuple[type, ...]) -> None:
    """An argument of the wrong type: TypeError, as Triton's bindings (pybind11) raise it."""
    if not isinstance(value, types):
        raise TypeError(f"{where}: '{arg}' cannot be {type(value).__name__}")
