"""TensorFlow models for tests and benchmarks (needs tensorflow; the server imports this
never).

``save_add_sub(folder)``: a SavedModel whose ``serving_default`` signature takes INPUT0 and
INPUT1 (FP32 [batch, 4]) and answers OUTPUT0 = sum, OUTPUT1 = difference; a second
signature ``doubled`` answers OUTPUT0 = 2 * INPUT0. ``save_strings(folder)``: TEXT
(string [batch]) -> SHOUTED (TEXT with "!" appended), LENGTH (int32 byte count).
``save_mlp(folder)``: X FP32 [batch, 256] -> Y = relu(X W1) W2, 1024 wide.
``frozen_add_sub()``: the add/sub function as a frozen GraphDef's bytes (Placeholders
INPUT0, INPUT1; outputs OUTPUT0, OUTPUT1). ``scaled_graph(scale)``: a GraphDef that is
not frozen: OUTPUT0 = INPUT0 (FP32 [batch, 4]) * a variable whose initializer, the op
``init``, sets it to ``scale``; it answers only once ``init`` has run (TF_INIT_OPS_FILE).
``save_v1_scaled(folder)``: the same graph as a TensorFlow 1 SavedModel (signature
``serving_default``), its variable saved at 1.0, and an op ``set_five`` that sets it to 5.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf

_PAIR = [
    tf.TensorSpec([None, 4], tf.float32, name="INPUT0"),
    tf.TensorSpec([None, 4], tf.float32, name="INPUT1"),
]


class _AddSub(tf.Module):
    @tf.function(input_signature=_PAIR)
    def add_sub(self, INPUT0: Any, INPUT1: Any) -> dict[str, Any]:
        return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="INPUT0")])
    def doubled(self, INPUT0: Any) -> dict[str, Any]:
        return {"OUTPUT0": INPUT0 * 2}


class _Strings(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="TEXT")])
    def shout(self, TEXT: Any) -> dict[str, Any]:
        return {"SHOUTED": tf.strings.join([TEXT, "!"]), "LENGTH": tf.strings.length(TEXT)}


class _Mlp(tf.Module):
    def __init__(self) -> None:
        rng = np.random.default_rng(4)
        self.w1 = tf.Variable(rng.standard_normal((256, 1024)).astype(np.float32))
        self.w2 = tf.Variable(rng.standard_normal((1024, 256)).astype(np.float32) / 32)

    @tf.function(input_signature=[tf.TensorSpec([None, 256], tf.float32, name="X")])
    def run(self, X: Any) -> dict[str, Any]:
        return {"Y": tf.matmul(tf.nn.relu(tf.matmul(X, self.w1)), self.w2)}


def save_add_sub(folder: Path) -> Path:
    m = _AddSub()
    tf.saved_model.save(
        m, str(folder), signatures={"serving_default": m.add_sub, "doubled": m.doubled}
    )
    return folder


def save_strings(folder: Path) -> Path:
    m = _Strings()
    tf.saved_model.save(m, str(folder), signatures={"serving_default": m.shout})
    return folder


def save_mlp(folder: Path) -> Path:
    m = _Mlp()
    tf.saved_model.save(m, str(folder), signatures={"serving_default": m.run})
    return folder


def frozen_add_sub() -> bytes:
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    @tf.function(input_signature=_PAIR)
    def add_sub(INPUT0: Any, INPUT1: Any) -> tuple[Any, Any]:
        return tf.identity(INPUT0 + INPUT1, name="OUTPUT0"), tf.identity(
            INPUT0 - INPUT1, name="OUTPUT1"
        )

    frozen = convert_variables_to_constants_v2(add_sub.get_concrete_function())
    return bytes(frozen.graph.as_graph_def().SerializeToString())


def scaled_graph(scale: float) -> bytes:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="INPUT0")
        v = tf.compat.v1.Variable(tf.fill([4], scale), name="scale")
        tf.identity(x * v, name="OUTPUT0")
        tf.compat.v1.variables_initializer([v], name="init")
    return bytes(graph.as_graph_def().SerializeToString())


def save_v1_scaled(folder: Path) -> Path:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="INPUT0")
        v = tf.compat.v1.Variable(tf.fill([4], 1.0), name="scale")
        y = tf.identity(x * v, name="OUTPUT0")
        tf.compat.v1.assign(v, tf.fill([4], 5.0), name="set_five")
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(v.initializer)
            builder = tf.compat.v1.saved_model.Builder(str(folder))
            signature = tf.compat.v1.saved_model.predict_signature_def(
                {"INPUT0": x}, {"OUTPUT0": y}
            )
            builder.add_meta_graph_and_variables(
                session, ["serve"], signature_def_map={"serving_default": signature}
            )
            builder.save()
    return folder
