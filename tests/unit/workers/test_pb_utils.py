"""shoal's triton_python_backend_utils (shoal/workers/pb_utils.py): what Python models call."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from shoal.configs.model_spec import ModelSpec
from shoal.ipc import messages as m
from shoal.ipc.errors import Code, ServingError
from shoal.workers import pb_utils
from shoal.workers.python_backend import PythonBackend
from shoal.workers.rescheduling import RESCHEDULED, RescheduledRequests


def test_a_model_imports_it_under_tritons_name_and_finalize_errors_are_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", [*sys.path])  # the load adds the model's folders
    monkeypatch.delitem(sys.modules, "1.model", raising=False)
    (tmp_path / "m" / "1").mkdir(parents=True)
    model = tmp_path / "m" / "1" / "model.py"
    model.write_text(
        "import triton_python_backend_utils as pb_utils\n"
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        self.utils = pb_utils\n"
        "    def finalize(self):\n"
        "        raise RuntimeError('cleanup failed')\n"
    )
    backend = PythonBackend()
    backend.load(model, ModelSpec("m", backend="python"), 1, False)
    assert backend.model.utils is pb_utils
    assert sys.modules["triton_python_backend_utils"] is pb_utils
    backend.unload()  # logged, not raised: the worker stops as it would have
    assert backend.model is None
    del sys.modules["1.model"]


def test_text_becomes_bytes_objects_as_in_triton() -> None:
    t = pb_utils.Tensor("T", np.array([["a", "bc"]]))
    assert t.as_numpy().dtype == object and t.as_numpy().tolist() == [[b"a", b"bc"]]
    assert t.name() == "T" and t.shape() == [1, 2] and t.is_cpu()
    with pytest.raises(pb_utils.TritonModelException):
        t.to_dlpack()


def test_getters_and_converters() -> None:
    req = pb_utils.InferenceRequest(
        [pb_utils.Tensor("A", np.ones(2, np.float32))], ["B"], parameters={"k": 1}
    )
    tensor = pb_utils.get_input_tensor_by_name(req, "A")
    assert tensor is not None and tensor.as_numpy().tolist() == [1.0, 1.0]
    assert pb_utils.get_input_tensor_by_name(req, "Z") is None
    assert req.requested_output_names() == ["B"] and json.loads(req.parameters()) == {"k": 1}
    config = {"output": [{"name": "B", "data_type": "TYPE_FP16"}]}
    assert pb_utils.get_output_config_by_name(config, "B") == config["output"][0]
    assert pb_utils.triton_string_to_numpy("TYPE_FP16") is np.float16
    assert pb_utils.triton_to_numpy_type(8) is np.int32
    assert pb_utils.numpy_to_triton_type(np.float32) == 11
    resp = pb_utils.InferenceResponse([pb_utils.Tensor("B", np.zeros(1))])
    assert not resp.has_error() and pb_utils.get_output_tensor_by_name(resp, "B") is not None
    err = pb_utils.TritonError("no", pb_utils.TritonError.INVALID_ARG)
    assert (err.message(), err.code()) == ("no", 3)
    with pytest.raises(pb_utils.TritonModelException, match="business logic scripting"):
        req.exec()


def test_a_response_sender_sends_until_its_final_flag() -> None:
    sent: list[tuple[object, bool]] = []
    cancelled = [False]
    sender = pb_utils.InferenceResponseSender(
        lambda r, final: sent.append((r, final)), lambda: cancelled[0]
    )
    request = pb_utils.InferenceRequest([], [], sender=sender)
    assert request.get_response_sender() is sender and not request.is_cancelled()
    response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.zeros(1))])
    sender.send(response)
    with pytest.raises(pb_utils.TritonModelException, match="must be provided"):
        sender.send()  # neither a response nor the final flag
    with pytest.raises(pb_utils.TritonModelException, match="expects an InferenceResponse"):
        sender.send("text")  # type: ignore[arg-type]
    cancelled[0] = True
    assert request.is_cancelled() and sender.is_cancelled()
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    with pytest.raises(pb_utils.TritonModelException) as err:
        sender.send(response)
    assert err.value.message() == "Unable to send response. Response sender has been closed."
    assert sent == [(response, False), (None, True)]


def test_a_dropped_sender_sends_the_final_flag_itself() -> None:
    sent: list[tuple[object, bool]] = []
    sender = pb_utils.InferenceResponseSender(lambda r, final: sent.append((r, final)))
    del sender
    assert sent == [(None, True)]


def test_a_request_of_a_model_that_is_not_decoupled_has_no_sender() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="decoupled transaction policy"):
        pb_utils.InferenceRequest([], []).get_response_sender()
    config = {"model_transaction_policy": {"decoupled": True}}
    assert pb_utils.using_decoupled_model_transaction_policy(config)
    assert not pb_utils.using_decoupled_model_transaction_policy({})


def test_arguments_of_the_wrong_type_are_refused_as_tritons_bindings_refuse_them() -> None:
    """TypeError where Triton's pybind11 bindings raise it, TritonModelException where its
    own checks do (L0_backend_python argument_validation)."""
    array = np.asarray([1, 2], dtype=np.int32)
    tensors = [pb_utils.Tensor("INPUT0", array)]
    for bad in (
        lambda: pb_utils.Tensor(None, array),  # type: ignore[arg-type]
        lambda: pb_utils.Tensor("OUTPUT0", None),
        lambda: pb_utils.InferenceRequest(inputs=None, requested_output_names=[], model_name="m"),
        lambda: pb_utils.InferenceRequest(inputs=tensors, requested_output_names=[None]),  # type: ignore[list-item]
        lambda: pb_utils.InferenceRequest(tensors, ["o"], model_name=None),  # type: ignore[arg-type]
        lambda: pb_utils.InferenceRequest(tensors, ["o"], model_name="m", correlation_id=None),  # type: ignore[arg-type]
        lambda: pb_utils.InferenceRequest(tensors, ["o"], model_name="m", flags=None),  # type: ignore[arg-type]
        lambda: pb_utils.InferenceResponse(output_tensors=None),  # type: ignore[arg-type]
        lambda: pb_utils.Logger.log("message", None),  # type: ignore[arg-type]
        lambda: pb_utils.Logger.log("message", 1),  # type: ignore[arg-type]  # (an enum, not 1)
        lambda: pb_utils.Logger.log_info(None),  # type: ignore[arg-type]
    ):
        with pytest.raises(TypeError):
            bad()
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceRequest(inputs=[None], requested_output_names=[], model_name="m")  # type: ignore[list-item]
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponse(output_tensors=[None])  # type: ignore[list-item]
    request = pb_utils.InferenceRequest(tensors, ["o"], model_name="m", correlation_id="s-5")
    assert request.correlation_id() == "s-5"
    pb_utils.InferenceResponse(output_tensors=[])
    pb_utils.Logger.log("at a level", pb_utils.Logger.WARNING)


def test_response_parameters_are_checked_and_read_back_as_tritons_are() -> None:
    """``InferenceResponse(parameters=)``: a dict of str keys and bool, int or str values,
    read back as JSON text; anything else refused in Triton's words (L0_backend_python
    parameters)."""
    given = {"bool": True, "str": "Hello World!", "int": 1024}
    response = pb_utils.InferenceResponse([], parameters=given)
    assert json.loads(response.parameters()) == given
    assert response.parameter_values() == given
    assert pb_utils.InferenceResponse([]).parameters() == "{}"
    for bad, message in (
        ([], "Expect dict, got <class 'list'>"),
        ({1: "int key"}, "Expect parameters keys to have type str, found type <class 'int'>"),
        ({"f": 0.5}, "values to have type bool/int/str, found type <class 'float'>"),
        ({"n": None}, "values to have type bool/int/str, found type <class 'NoneType'>"),
        ({"l": ["x"]}, "values to have type bool/int/str, found type <class 'list'>"),
    ):
        with pytest.raises(pb_utils.TritonModelException) as err:
            pb_utils.InferenceResponse([], parameters=bad)
        assert str(err.value) == message if bad == [] else message in str(err.value)


def test_a_bls_request_takes_a_name_read_from_bytes_and_a_trace_to_continue() -> None:
    """bls_simple (Triton's qa) names its model with a BYTES tensor's element and passes
    ``request.trace()`` on: pybind11 takes bytes for a string, and a request's trace is
    what a BLS request names as its parent (not traced: id 0, no OpenTelemetry context)."""
    name = np.array([b"simple"], dtype=np.object_)[0]
    traced = pb_utils.InferenceRequest([], [], trace=pb_utils.InferenceTrace(7))
    req = pb_utils.InferenceRequest([], [], model_name=name, trace=traced.trace())
    assert req.model_name() == "simple" and req.trace().trace_id == 7
    plain = pb_utils.InferenceRequest([], [])
    assert plain.trace().trace_id == 0 and plain.trace().get_context() is None


class _Rescheduler:
    """A model that reschedules every request (None for each), or answers one."""

    answer = False

    def execute(self, requests: list) -> list:
        for r in requests:
            r.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
        out = pb_utils.InferenceResponse([])
        return [out if self.answer else None for _ in requests]


def test_a_rescheduled_request_is_held_where_iterative_and_refused_elsewhere() -> None:
    backend = PythonBackend()
    backend.instance_name, backend.model = "m_0", _Rescheduler()
    start = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
    request = pb_utils.InferenceRequest([], [], flags=start)
    backend.iterative = True
    assert backend.execute_requests([request]) == [RESCHEDULED]
    held = RescheduledRequests()
    held.add(m.WorkItem(b"f", m.InferRequest(7, "m", 1, [], [])), {}, request)
    (again,) = held.take()  # run again as Triton runs it: no flags, released in full
    assert again.request.flags() == 0
    assert again.request.release_flags() == pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL
    backend.iterative = False
    (refused,) = backend.execute_requests([request])
    assert isinstance(refused, ServingError) and refused.code == Code.INTERNAL
    assert "while the model is not configured to handle such a flag" in refused.message
    backend.iterative, backend.model.answer = True, True
    (failed,) = backend.execute_requests([request])
    assert isinstance(failed, ServingError)
    assert "Expected a None object in the execute function return list for reschduled" in (
        failed.message
    )


def test_a_request_s_flags_may_be_set_and_its_timeout_read_as_tritons() -> None:
    """Triton's bindings: ``set_flags`` (a BLS request's sequence flags, an int only),
    ``timeout()``; and the module's ``TRITON_STRING_TO_NUMPY`` table."""
    request = pb_utils.InferenceRequest([], ["o"], model_name="m", correlation_id=3, timeout=7)
    request.set_flags(pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START)
    assert (request.flags(), request.timeout()) == (1, 7)
    with pytest.raises(TypeError):
        request.set_flags("1")  # type: ignore[arg-type]
    assert pb_utils.TRITON_STRING_TO_NUMPY["TYPE_FP16"] is np.float16
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
