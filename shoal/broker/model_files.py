"""A loaded model's own files, read for a frontend (``ModelFileQuery``): what a model's
config names beside its weights, such as the tokenizer and chat template the OpenAI API
reads (shoal/frontend/openai/). Only the broker knows where each model's directory is
(a repository, one of several, a synced copy of object storage, a load's own files), so
the frontends ask it.

A path is relative to the version's directory, else the model's; one that leaves the
model's directory is refused, and so is a file over ``MAX_MODEL_FILE_BYTES``. The read
blocks the broker's loop for as long as it takes: such files are small and each frontend
reads each once per load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from shoal.configs.model_control import load_file_parts
from shoal.ipc import messages as m
from shoal.ipc.errors import Code

#: The largest model file a frontend may ask for (a tokenizer of a large vocabulary is a
#: few MB; the answer travels as one ZeroMQ message).
MAX_MODEL_FILE_BYTES: Final = 32 * 1024 * 1024


def read_model_file(model_dir: Path | None, q: m.ModelFileQuery) -> m.ModelFileReply:
    """The file ``q.path`` of the model whose directory is ``model_dir`` (None: the model
    is not loaded), or the error why not (NOT_FOUND, INVALID_ARG)."""
    if model_dir is None:
        return _error(q, Code.NOT_FOUND, f"model '{q.model}' is not loaded")
    parts = load_file_parts(q.path)
    if parts is None:
        return _error(q, Code.INVALID_ARG, f"'{q.path}' is outside the model's directory")
    for base in (model_dir / str(q.version), model_dir):
        path = base.joinpath(*parts)
        try:
            if not path.is_file():
                continue
            if path.stat().st_size > MAX_MODEL_FILE_BYTES:
                return _error(
                    q, Code.INVALID_ARG, f"'{q.path}' is larger than {MAX_MODEL_FILE_BYTES} bytes"
                )
            return m.ModelFileReply(q.query_id, None, path.read_bytes())
        except OSError as exc:
            return _error(q, Code.INTERNAL, f"cannot read '{q.path}': {exc.strerror or exc}")
    return _error(q, Code.NOT_FOUND, f"model '{q.model}' has no file '{q.path}'")


def _error(q: m.ModelFileQuery, code: Code, message: str) -> m.ModelFileReply:
    return m.ModelFileReply(q.query_id, m.ErrorInfo(int(code), message))
