"""The broker's reading of a loaded model's files for the frontends (a tokenizer, a chat
template): the version's directory first, then the model's, never outside it."""

from __future__ import annotations

from pathlib import Path

from shoal.broker.model_files import read_model_file
from shoal.ipc import messages as m


def test_model_files_are_read_from_the_version_then_the_model(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "tok.json").write_text("model")
    (tmp_path / "1" / "tok.json").write_text("version")
    (tmp_path / "tmpl.jinja").write_text("t")

    def read(path: str, version: int = 1, model_dir: Path | None = tmp_path) -> m.ModelFileReply:
        return read_model_file(model_dir, m.ModelFileQuery(7, "g", version, path))

    assert read("tok.json").data == b"version"
    assert read("tok.json", version=2).data == b"model"
    assert read("tmpl.jinja").data == b"t"
    for path, code in [("../x", 4), ("nope", 3), ("/", 4)]:
        reply = read(path)
        assert reply.error is not None and reply.error.code == code, path
    gone = read("tok.json", model_dir=None)
    assert gone.error is not None and "not loaded" in gone.error.message
