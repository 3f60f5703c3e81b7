"""grpcio's ERROR for an answer it could not send to a call that had already ended."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from grpc._cython import cygrpc

import shoal.frontend.grpc_server  # noqa: F401  (installs the filter on grpcio's logger)

GRPC_LOG = logging.getLogger("grpc._cython.cygrpc")
METHOD = "/inference.GRPCInferenceService/ModelInfer"
# What grpcio's execute_batch raises when core refuses the send of a finished call.
LATE = 'Failed "execute_batch": (<SendInitialMetadataOperation>, <SendMessageOperation>)'


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def kept() -> Iterator[_Kept]:
    handler = _Kept()
    root = logging.getLogger()
    level = root.level
    GRPC_LOG.addHandler(handler)
    try:
        yield handler
    finally:
        GRPC_LOG.removeHandler(handler)
        root.setLevel(level)


def _grpc_logs(exc: Exception) -> None:
    """As grpcio's _handle_exceptions logs an ExecuteBatchError."""
    try:
        raise exc
    except Exception:
        GRPC_LOG.exception("ExecuteBatchError raised in core by servicer method [%s]", METHOD)


def test_a_late_answer_is_not_an_error(kept: _Kept) -> None:
    logging.getLogger().setLevel(logging.INFO)
    _grpc_logs(cygrpc.ExecuteBatchError(LATE))
    assert kept.records == []


def test_a_late_answer_is_one_debug_line_when_verbose(kept: _Kept) -> None:
    logging.getLogger().setLevel(logging.DEBUG)
    _grpc_logs(cygrpc.ExecuteBatchError(LATE))
    [record] = kept.records
    assert record.levelno == logging.DEBUG
    assert record.exc_info is None
    assert record.getMessage() == (
        f"{METHOD}: the call ended (cancelled, or past its deadline) before its answer was sent"
    )


def test_a_batch_core_refused_to_start_stays_an_error(kept: _Kept) -> None:
    logging.getLogger().setLevel(logging.INFO)
    exc = cygrpc.ExecuteBatchError("Failed grpc_call_start_batch: 8 with grpc_call_error value")
    _grpc_logs(exc)
    [record] = kept.records
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None and record.exc_info[1] is exc


def test_other_grpc_errors_pass_unchanged(kept: _Kept) -> None:
    logging.getLogger().setLevel(logging.INFO)
    _grpc_logs(ValueError('Failed "execute_batch"'))
    [record] = kept.records
    assert record.levelno == logging.ERROR
    assert "ExecuteBatchError raised in core" in record.getMessage()
