"""Where a load request's ``file:<path>`` lands in the model's folder (shoal.configs.model_control
.load_file_parts), as Triton's core joins and checks it."""

from __future__ import annotations

import pytest

from shoal.configs.model_control import load_file_parts


@pytest.mark.parametrize(
    ("path", "parts"),
    [
        ("1/model.onnx", ("1", "model.onnx")),
        ("/1/model.py", ("1", "model.py")),  # Triton's JoinPath appends it as relative
        ("1/./model.py", ("1", "model.py")),
        ("1/../2/model.py", ("2", "model.py")),  # normalized, still inside
        ("../escape", None),
        ("1/../../escape", None),
        ("", None),
        ("/", None),
        (".", None),
    ],
)
def test_file_paths_land_inside_the_model_folder_or_nowhere(
    path: str, parts: tuple[str, ...] | None
) -> None:
    assert load_file_parts(path) == parts
