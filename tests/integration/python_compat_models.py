"""The model.py files of the Python compatibility suite (test_python_compat.py), written in
the style of Triton's python_backend examples, with their configs: ``MODELS`` maps each
model's name to (its model.py, the config's lines after name and backend)."""

from __future__ import annotations

ADD_SUB = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            out_0, out_1 = (in_0.as_numpy() + in_1.as_numpy(), in_0.as_numpy() - in_1.as_numpy())
            out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(self.output0_dtype))
            out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(self.output1_dtype))
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[out_tensor_0, out_tensor_1]))
        return responses

    def finalize(self):
        print("Cleaning up...")
"""
BLS_SYNC = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            infer_request = pb_utils.InferenceRequest(
                model_name="add_sub",
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                        pb_utils.get_input_tensor_by_name(request, "INPUT1")],
                preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0))
            infer_response = infer_request.exec()
            if infer_response.has_error():
                raise pb_utils.TritonModelException(infer_response.error().message())
            assert all(t.is_cpu() for t in infer_response.output_tensors())
            responses.append(pb_utils.InferenceResponse(infer_response.output_tensors()))
        return responses
"""
BLS_ASYNC = """
import asyncio
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                      pb_utils.get_input_tensor_by_name(request, "INPUT1")]
            calls = [pb_utils.InferenceRequest(model_name="add_sub", inputs=inputs,
                                               requested_output_names=[name]).async_exec()
                     for name in ("OUTPUT0", "OUTPUT1")]
            first, second = await asyncio.gather(*calls)
            for answer in (first, second):
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
            out_0 = pb_utils.get_output_tensor_by_name(first, "OUTPUT0")
            out_1 = pb_utils.get_output_tensor_by_name(second, "OUTPUT1")
            responses.append(pb_utils.InferenceResponse([out_0, out_1]))
        return responses
"""
REPEAT = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            thread = threading.Thread(target=self.respond, args=(sender, values))
            thread.start()
            self.threads.append(thread)
        return None

    def respond(self, sender, values):
        for idx, value in enumerate(values):
            out = pb_utils.Tensor("OUT", np.array([value], np.int32))
            index = pb_utils.Tensor("IDX", np.array([idx], np.uint32))
            sender.send(pb_utils.InferenceResponse([out, index]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
"""
SQUARE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = pb_utils.get_output_config_by_name(json.loads(args["model_config"]), "OUT")
        self.out_dtype = pb_utils.triton_string_to_numpy(config["data_type"])

    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            for _ in range(count):
                out = pb_utils.Tensor("OUT", np.array([count], self.out_dtype))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None


import json
"""
AUTO_COMPLETE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        inputs = [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
                  {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]}]
        outputs = [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]
        config = auto_complete_model_config.as_dict()
        input_names = [i["name"] for i in config["input"]]
        for i in inputs:
            if i["name"] not in input_names:
                auto_complete_model_config.add_input(i)
        for o in outputs:
            auto_complete_model_config.add_output(o)
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
                    pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
                    * pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy())])
                for r in requests]
"""
# A decoupled model by its own auto-complete: each request answered twice.
AUTO_DECOUPLED = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [1]})
        config.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]})
        config.set_model_transaction_policy({"decoupled": True})
        return config

    def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            for _ in range(2):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
# Its metrics; OUTPUT2: its counter's line as the model itself scrapes it in execute (the
# request parameter "metrics_url"), as Triton's QA model does.
CUSTOM_METRICS = """
import json
import urllib.request
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "version": args["model_version"]}
        # (the families are kept: a family let go of ends its metrics, as in Triton)
        self.requests_family = pb_utils.MetricFamily(
            name="requests_seen", description="Requests this model has seen",
            kind=pb_utils.MetricFamily.COUNTER)
        self.requests = self.requests_family.Metric(labels=labels)
        self.last_family = pb_utils.MetricFamily(
            name="last_input_sum", description="The sum of the last request's input",
            kind=pb_utils.MetricFamily.GAUGE)
        self.last = self.last_family.Metric(labels=labels)
        self.sizes_family = pb_utils.MetricFamily(
            name="input_sum", description="Sums of the inputs",
            kind=pb_utils.MetricFamily.HISTOGRAM)
        self.sizes = self.sizes_family.Metric(labels=labels, buckets=[1.0, 10.0])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            self.requests.increment(1)
            self.last.set(float(x.sum()))
            self.sizes.observe(float(x.sum()))
            try:
                self.requests.increment(-1)
                refusal = "none"
            except pb_utils.TritonModelException as exc:
                refusal = str(exc)
            url = json.loads(request.parameters()).get("metrics_url")
            line = ""
            if url:
                with urllib.request.urlopen(url, timeout=10) as reply:
                    page = reply.read().decode()
                line = next(l for l in page.splitlines() if l.startswith("requests_seen{"))
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", np.array([self.requests.value()], np.float32)),
                pb_utils.Tensor("OUTPUT1", np.array([refusal.encode()], np.object_)),
                pb_utils.Tensor("OUTPUT2", np.array([line.encode()], np.object_))]))
        return responses
"""
# add_sub through torch, zero-copy both ways (Triton's dlpack_add_sub example's style);
# OUTPUT1 from a __dlpack__ object, OUTPUT0 from a capsule.
DLPACK_ADD_SUB = """
import torch
from torch.utils.dlpack import from_dlpack, to_dlpack
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            assert in_0.is_cpu() and in_1.is_cpu()
            a, b = from_dlpack(in_0.to_dlpack()), torch.from_dlpack(in_1)
            out_0 = pb_utils.Tensor.from_dlpack("OUTPUT0", to_dlpack(a + b))
            out_1 = pb_utils.Tensor.from_dlpack("OUTPUT1", a - b)
            responses.append(pb_utils.InferenceResponse([out_0, out_1]))
        return responses
"""
# Triton's identity_bf16 style: BF16 refuses as_numpy and goes through torch by DLPack.
IDENTITY_BF16 = """
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            try:
                tensor.as_numpy()
                raise AssertionError("as_numpy of a BF16 tensor")
            except pb_utils.TritonModelException as exc:
                assert "tensor dtype is bf16" in str(exc).lower()
            as_torch = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
            assert as_torch.dtype == torch.bfloat16
            out = pb_utils.Tensor.from_dlpack("OUTPUT0", torch.utils.dlpack.to_dlpack(as_torch * 2))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""
# BLS with BF16 both ways: the input passed on, the answer's tensor returned as it is.
BLS_BF16 = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            answer = pb_utils.InferenceRequest(
                model_name="identity_bf16", requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0")]).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            out = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0")
            assert out.triton_dtype() == 14  # TYPE_BF16
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""
# What a request says of itself: its id, correlation id (with its type), flags, parameters.
REQUEST_INFO = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            corrid = request.correlation_id()
            info = {"id": request.request_id(), "corrid": [type(corrid).__name__, corrid],
                    "flags": request.flags(), "parameters": json.loads(request.parameters())}
            text = np.array([json.dumps(info).encode()], np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", text)]))
        return responses
"""
# Each request: the model loading API's walk, as text (JSON) in OUTPUT0.
LOADER = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

GENERATED = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y",
                    pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 3)]) for r in requests]
'''
CONFIG = json.dumps({
    "backend": "python",
    "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}],
    "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}],
})


class TritonPythonModel:
    def execute(self, requests):
        steps = {}
        steps["ready_before"] = pb_utils.is_model_ready("generated")
        try:
            pb_utils.load_model(model_name="no_such_model")
        except pb_utils.TritonModelException as exc:
            steps["unknown"] = str(exc)
        pb_utils.load_model(model_name="generated", config=CONFIG,
                            files={"file:1/model.py": GENERATED.encode()})
        steps["ready_after"] = pb_utils.is_model_ready(model_name="generated", model_version="1")
        answer = pb_utils.InferenceRequest(
            model_name="generated", requested_output_names=["Y"],
            inputs=[pb_utils.Tensor("X", np.array([1.0, 2.0], np.float32))]).exec()
        steps["answer"] = answer.output_tensors()[0].as_numpy().tolist()
        pb_utils.unload_model("generated")
        steps["ready_unloaded"] = pb_utils.is_model_ready("generated")
        try:
            pb_utils.is_model_ready("generated", "one")
        except pb_utils.TritonModelException as exc:
            steps["bad_version"] = str(exc)
        text = np.array([json.dumps(steps).encode()], np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", text)]) for _ in requests]
"""
# Where it runs: its interpreter's prefix, a module of its environment's own.
IN_ENV = """
import sys
import numpy as np
import env_marker
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        text = np.array([sys.prefix.encode(), env_marker.VALUE.encode()], np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", text)]) for _ in requests]
"""
# Triton's model readiness example's style: its own check, here a file in its folder.
READY_GATE = """
import os
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.gate = os.path.join(args["model_repository"], "not_ready")

    def is_ready(self):
        return not os.path.exists(self.gate)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
                    pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                for r in requests]
"""
# Triton's logging example's style: a line at each level in each of its three steps.
LOGGING = """
import triton_python_backend_utils as pb_utils


def log_each(step):
    logger = pb_utils.Logger
    logger.log(f"{step}-Specific Msg!", logger.INFO)
    logger.log_info(f"{step}-Info Msg!")
    logger.log_warn(f"{step}-Warning Msg!")
    logger.log_error(f"{step}-Error Msg!")
    logger.log_verbose(f"{step}-Verbose Msg!")


class TritonPythonModel:
    def initialize(self, args):
        log_each("Initialize")

    def execute(self, requests):
        log_each("Execute")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
                    pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                for r in requests]

    def finalize(self):
        log_each("Finalize")
"""
ENV_PARAMETER = (
    'parameters { key: "EXECUTION_ENV_PATH" '
    'value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }'
)


def _io(kind: str, name: str, datatype: str, dims: str) -> str:
    return f'{kind} [ {{ name: "{name}" data_type: {datatype} dims: [ {dims} ] }} ]'


def _pair(prefix: str, datatype: str = "TYPE_FP32", dims: str = "4") -> str:
    return (
        f'{{ name: "{prefix}0" data_type: {datatype} dims: [ {dims} ] }}, '
        f'{{ name: "{prefix}1" data_type: {datatype} dims: [ {dims} ] }}'
    )


ADD_SUB_IO = f"input [ {_pair('INPUT')} ]\noutput [ {_pair('OUTPUT')} ]"
DECOUPLED = "model_transaction_policy { decoupled: true }"
MODELS: dict[str, tuple[str, str]] = {
    "add_sub": (ADD_SUB, ADD_SUB_IO),
    "bls_sync": (BLS_SYNC, ADD_SUB_IO),
    "bls_async": (BLS_ASYNC, ADD_SUB_IO),
    "dlpack_add_sub": (DLPACK_ADD_SUB, ADD_SUB_IO),
    "repeat_int32": (
        REPEAT,
        "\n".join(
            [
                _io("input", "IN", "TYPE_INT32", "-1"),
                'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, '
                '{ name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]',
                DECOUPLED,
            ]
        ),
    ),
    "square_int32": (
        SQUARE,
        "\n".join(
            [
                _io("input", "IN", "TYPE_INT32", "1"),
                _io("output", "OUT", "TYPE_INT32", "1"),
                DECOUPLED,
            ]
        ),
    ),
    "auto_complete": (AUTO_COMPLETE, _io("input", "INPUT0", "TYPE_FP32", "4")),
    "auto_decoupled": (AUTO_DECOUPLED, "max_batch_size: 0"),
    "custom_metrics": (
        CUSTOM_METRICS,
        "\n".join(
            [
                _io("input", "INPUT0", "TYPE_FP32", "4"),
                'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }, '
                '{ name: "OUTPUT1" data_type: TYPE_STRING dims: [ 1 ] }, '
                '{ name: "OUTPUT2" data_type: TYPE_STRING dims: [ 1 ] } ]',
            ]
        ),
    ),
    "loader": (
        LOADER,
        "\n".join(
            [_io("input", "INPUT0", "TYPE_FP32", "1"), _io("output", "OUTPUT0", "TYPE_STRING", "1")]
        ),
    ),
    "identity_bf16": (
        IDENTITY_BF16,
        "\n".join(
            [_io("input", "INPUT0", "TYPE_BF16", "4"), _io("output", "OUTPUT0", "TYPE_BF16", "4")]
        ),
    ),
    "bls_bf16": (
        BLS_BF16,
        "\n".join(
            [_io("input", "INPUT0", "TYPE_BF16", "4"), _io("output", "OUTPUT0", "TYPE_BF16", "4")]
        ),
    ),
    "request_info": (
        REQUEST_INFO,
        "\n".join(
            [
                _io("input", "INPUT0", "TYPE_FP32", "1"),
                _io("output", "OUTPUT0", "TYPE_STRING", "1"),
                "sequence_batching { }",
            ]
        ),
    ),
    "ready_gate": (
        READY_GATE,
        "\n".join(
            [_io("input", "INPUT0", "TYPE_FP32", "1"), _io("output", "OUTPUT0", "TYPE_FP32", "1")]
        ),
    ),
    "logging": (
        LOGGING,
        "\n".join(
            [_io("input", "INPUT0", "TYPE_FP32", "1"), _io("output", "OUTPUT0", "TYPE_FP32", "1")]
        ),
    ),
    "in_env": (
        IN_ENV,
        "\n".join(
            [
                _io("input", "INPUT0", "TYPE_FP32", "1"),
                _io("output", "OUTPUT0", "TYPE_STRING", "2"),
                ENV_PARAMETER,
            ]
        ),
    ),
}
#: Asked for at load by the tests: an environment missing, one that is no archive.
ENV_FAILURES = ("env_missing", "env_broken")
