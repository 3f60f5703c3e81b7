"""Classification of an ensemble's outputs with the ensemble's own labels.

Triton labels an ensemble's classification results with the ensemble's label provider:
an output's ``label_filename`` in the ensemble's config, else the labels of the step's
model that produces it. A step's model classifies with its own labels, so shoal asks the
producing step to classify, which gives the second case; where the ensemble's config
names labels of its own for the output, the step is asked for the values instead and the
ensemble classifies them here (``classify``), with the ensemble's labels. Pure.
"""

from __future__ import annotations

import numpy as np

from shoal.dataplane import client_shm_refs
from shoal.dataplane.classification import parse_labels, top_k
from shoal.dataplane.model_handle import ModelHandle
from shoal.dataplane.types import OutputTensor, RequestedOutput
from shoal.ipc import datatypes
from shoal.ipc.errors import Code, ServingError

CLASSIFICATION = "classification"


def own_count(handle: ModelHandle, asked: RequestedOutput) -> int:
    """How many top classes the ensemble itself gives of ``asked``: its classification
    count where the ensemble's config labels the output and the client did not put it
    in shared memory; 0 where the producing step classifies (or nothing does)."""
    count = asked.parameters.get(CLASSIFICATION)
    spec = handle.outputs.get(asked.name)
    if type(count) is not int or count <= 0 or spec is None or not spec.label_filename:
        return 0
    return 0 if client_shm_refs.output_spec(asked) is not None else count


def label_file(handle: ModelHandle, output: str) -> str:
    """The file (in the ensemble's directory) that labels ``output``."""
    return handle.outputs[output].label_filename


def classify(out: OutputTensor, count: int, batched: bool, labels: bytes) -> OutputTensor:
    """``out`` (the values a step gave) as its top ``count`` classes, "value:index:label"
    with the lines of ``labels`` (the label file's text), as a step would give them."""
    kind = datatypes.datatype(out.datatype)
    try:
        if kind is None or kind.numpy is None or out.data is None:  # (top_k's refusal)
            top_k(np.empty(0), count, out.datatype, batched, None)
        assert kind is not None and kind.numpy is not None and out.data is not None
        values = np.frombuffer(out.data, dtype=kind.numpy).reshape(out.shape)
        classes = top_k(values, count, out.datatype, batched, parse_labels(labels.decode()))
    except ValueError as exc:
        raise ServingError(Code.INVALID_ARG, str(exc)) from None
    data = memoryview(datatypes.serialize_bytes(classes.reshape(-1)))
    params = {k: v for k, v in out.parameters.items() if k != CLASSIFICATION}
    return OutputTensor(out.name, "BYTES", list(classes.shape), data, params)
