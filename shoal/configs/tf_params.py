"""A TensorFlow model's parameters, read as Triton's TensorFlow backend reads them
(src/tensorflow.cc ModelState::ParseParameters, in its order):

- ``MAX_SESSION_SHARE_COUNT``: an integer ("failed to convert '<v>' to integral number"),
  positive ("parameter 'MAX_SESSION_SHARE_COUNT' must be positive number for TensorFlow
  model '<m>'"); shoal runs one session per instance process, so it shares nothing;
- ``TF_NUM_INTRA_THREADS``: a non-negative integer ("... must be non-negative number ...");
- ``TF_NUM_INTER_THREADS``: an integer;
- ``TF_USE_PER_SESSION_THREADS``: a boolean (one session per process: nothing to do);
- ``TF_GRAPH_TAG`` (default ``serve``) and ``TF_SIGNATURE_DEF`` (default
  ``serving_default``, and then, if the SavedModel has no such signature, its first one that
  is not an init or train signature) pick a SavedModel's graph and signature;
- ``TF_INIT_OPS_FILE``: a JSON file (``init_ops``: op names) that `init_ops` reads; the
  worker runs those graph ops once at load (a GraphDef's, a TensorFlow 1 SavedModel's).

Pure but for `init_ops`, which reads its file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from shoal.configs.backend_params import ParamSource, bool_parameter, int_parameter, parameters
from shoal.configs.schema import ConfigError


@dataclass(frozen=True, slots=True)
class TfParams:
    intra_op_threads: int = 0  # 0: the instance's own count
    inter_op_threads: int = 0  # 0: TensorFlow's default
    graph_tag: str = ""  # "": serve
    signature_def: str = ""  # "": serving_default, or the first serving one
    init_ops_file: str = ""


def _string(config: ParamSource, key: str) -> str:
    return parameters(config).get(key, "")


def tf_params(config: ParamSource) -> TfParams:
    """The parameters; raises ConfigError with Triton's message for the first bad one."""
    name = config.name
    share = int_parameter(config, "MAX_SESSION_SHARE_COUNT")
    if share is not None and share <= 0:
        raise ConfigError(
            name,
            "parameter 'MAX_SESSION_SHARE_COUNT' must be positive number for TensorFlow "
            f"model '{name}'",
        )
    intra = int_parameter(config, "TF_NUM_INTRA_THREADS")
    if intra is not None and intra < 0:
        raise ConfigError(
            name,
            f"parameter 'TF_NUM_INTRA_THREADS' must be non-negative number for TensorFlow "
            f"model '{name}'",
        )
    inter = int_parameter(config, "TF_NUM_INTER_THREADS")
    bool_parameter(config, "TF_USE_PER_SESSION_THREADS")
    return TfParams(
        intra_op_threads=intra or 0,
        inter_op_threads=max(inter or 0, 0),
        graph_tag=_string(config, "TF_GRAPH_TAG"),
        signature_def=_string(config, "TF_SIGNATURE_DEF"),
        init_ops_file=_string(config, "TF_INIT_OPS_FILE"),
    )


def init_ops(model_file: Path, file_name: str, model: str) -> list[str]:
    """The ops ``TF_INIT_OPS_FILE`` names, as Triton's TensorFlow backend reads them: the
    file in the version folder (``model_file``'s), else in the model's folder, a JSON
    object whose ``init_ops`` is a list of op names. Raises ConfigError."""
    path = model_file.parent / file_name
    if not path.is_file():
        path = model_file.parent.parent / file_name
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(
            model, f"failed to open text file for read {path}: {exc.strerror or exc}"
        ) from None
    try:
        ops = json.loads(text)["init_ops"]
    except (ValueError, KeyError, TypeError) as exc:
        why = "no 'init_ops' member" if isinstance(exc, KeyError | TypeError) else str(exc)
        raise ConfigError(model, f"TF_INIT_OPS_FILE {path}: {why}") from None
    if not isinstance(ops, list) or not all(isinstance(op, str) for op in ops):
        raise ConfigError(model, f"TF_INIT_OPS_FILE {path}: 'init_ops' must be a list of op names")
    return ops
