"""Errors as they travel between processes and out to clients.

An error is a Triton error code plus a message; no exception object ever crosses a
socket. Each transport maps the code to its own status (HTTP status, gRPC code)
with the table Triton uses.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final


class Code(IntEnum):
    UNKNOWN = 1
    INTERNAL = 2
    NOT_FOUND = 3
    INVALID_ARG = 4
    UNAVAILABLE = 5
    UNSUPPORTED = 6
    ALREADY_EXISTS = 7
    CANCELLED = 8


HTTP_STATUS: Final[dict[Code, int]] = {
    Code.UNKNOWN: 400,
    Code.INTERNAL: 500,
    Code.NOT_FOUND: 404,
    Code.INVALID_ARG: 400,
    Code.UNAVAILABLE: 503,
    Code.UNSUPPORTED: 501,
    Code.ALREADY_EXISTS: 400,
    Code.CANCELLED: 400,
}

# grpc.StatusCode member names, kept as strings so this module does not import grpc.
GRPC_STATUS: Final[dict[Code, str]] = {
    Code.UNKNOWN: "UNKNOWN",
    Code.INTERNAL: "INTERNAL",
    Code.NOT_FOUND: "NOT_FOUND",
    Code.INVALID_ARG: "INVALID_ARGUMENT",
    Code.UNAVAILABLE: "UNAVAILABLE",
    Code.UNSUPPORTED: "UNIMPLEMENTED",
    Code.ALREADY_EXISTS: "ALREADY_EXISTS",
    Code.CANCELLED: "CANCELLED",
}


class ServingError(Exception):
    """An error with a Triton code, raised inside a process and sent as code + message."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]


class RequestError(ServingError):
    """A request refused by Triton's per-request checks (its InferenceRequest validation,
    a full scheduler queue): Triton's message names the request, as ``named`` writes it.
    Raised where the client's request id is not at hand; the frontend names it."""


class AnswerError(ServingError):
    """An error a request's answer carried (its model's, or its instance's end), as
    opposed to one that refused the request before it ran."""


def named(message: str, request_id: str) -> str:
    """Triton's form of a request's error: ``[request id: <id>] <message>``."""
    return f"[request id: {request_id or '<id_unknown>'}] {message}"


def invalid_arg(message: str) -> ServingError:
    return ServingError(Code.INVALID_ARG, message)


def invalid_request(message: str) -> RequestError:
    return RequestError(Code.INVALID_ARG, message)


#: What Triton's ModelRepositoryManager::GetModel puts before every reason a model (or
#: version) cannot be had: not found, not at ready state, no available versions.
UNKNOWN_MODEL: Final = "Request for unknown model: "
# Load and unload outside explicit model control mode: Triton 2.51's words.
MODEL_CONTROL_DISABLED: Final = "explicit model load / unload is not allowed if polling is enabled"


# A decoupled model called where one answer is all a call can carry: Triton 2.51's words.
DECOUPLED_UNARY: Final = "ModelInfer RPC doesn't support models with decoupled transaction policy"
DECOUPLED_HTTP: Final = "HTTP end point doesn't support models with decoupled transaction policy"


def unknown_model(name: str) -> ServingError:
    """NOT_FOUND (HTTP 404), as Triton 2.51 answers it over both protocols (checked
    against the real server side by side)."""
    return ServingError(Code.NOT_FOUND, f"{UNKNOWN_MODEL}'{name}' is not found")
