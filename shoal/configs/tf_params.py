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
- ``TF_INIT_OPS_FILE``: read, not run by shoal (a note in the log).

Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

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
