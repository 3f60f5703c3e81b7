"""Triton's top-K classification of an output (shoal.dataplane.classification), as its
TopkClassifications writes it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shoal.configs.model_config import parse_config_text
from shoal.configs.spec_reader import read_spec
from shoal.dataplane import classification


def _strings(arr: np.ndarray) -> list[object]:
    return np.vectorize(bytes.decode, otypes=[object])(arr).tolist()


def test_integers_rank_per_batch_entry_with_their_index() -> None:
    values = np.array([[1, 3, 2], [9, 7, 8]], np.int32)
    out = classification.top_k(values, 2, "INT32", batched=True, labels=None)
    assert out.shape == (2, 2)
    assert _strings(out) == [["3:1", "2:2"], ["9:0", "8:2"]]


def test_a_model_that_does_not_batch_ranks_the_whole_output() -> None:
    values = np.array([[1, 3, 2], [9, 7, 8]], np.int32)
    out = classification.top_k(values, 2, "INT32", batched=False, labels=None)
    assert _strings(out) == ["9:3", "8:5"]


def test_floats_as_cpp_to_string_writes_them_and_k_is_capped() -> None:
    values = np.array([[0.5, 0.25, 1.5, -2.0]], np.float32)
    out = classification.top_k(values, 9, "FP32", batched=True, labels=None)
    assert _strings(out) == [["1.500000:2", "0.500000:0", "0.250000:1", "-2.000000:3"]]


def test_unsigned_and_narrow_types_compare_as_themselves() -> None:
    out = classification.top_k(np.array([[200, 7, 255]], np.uint8), 2, "UINT8", True, None)
    assert _strings(out) == [["255:2", "200:0"]]


def test_equal_values_keep_their_index_order() -> None:
    out = classification.top_k(np.full((1, 4), 2, np.int64), 3, "INT64", True, None)
    assert _strings(out) == [["2:0", "2:1", "2:2"]]


def test_labels_follow_the_index_and_an_empty_line_or_a_missing_one_is_no_label() -> None:
    values = np.array([[0.1, 0.9, 0.5, 0.7]], np.float64)
    out = classification.top_k(values, 4, "FP64", True, ["cat", "dog", ""])
    assert _strings(out) == [["0.900000:1:dog", "0.700000:3", "0.500000:2", "0.100000:0:cat"]]


@pytest.mark.parametrize("datatype", ["BOOL", "BYTES", "FP16", "BF16"])
def test_types_triton_cannot_rank_are_refused_in_its_words(datatype: str) -> None:
    with pytest.raises(ValueError) as e:
        classification.top_k(np.zeros((1, 2), np.float32), 1, datatype, True, None)
    assert str(e.value) == (
        f"class result not available for output due to unsupported type '{datatype}'"
    )


def test_labels_come_from_the_model_directory_one_per_line(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_text("cat\ndog\n\nbird\n")
    config = read_spec(
        parse_config_text(
            'name: "m"\noutput [ { name: "P" data_type: TYPE_FP32 dims: [ 4 ] '
            'label_filename: "labels.txt" }, { name: "Q" data_type: TYPE_FP32 dims: [ 1 ] } ]',
            "m",
        )
    )
    assert classification.labels_of(config, tmp_path) == {"P": ["cat", "dog", "", "bird"]}
    (tmp_path / "labels.txt").unlink()
    with pytest.raises(ValueError, match="failed to read labels of output 'P'"):
        classification.labels_of(config, tmp_path)
