"""Triton's classification extension: an output asked for with ``classification: K``
comes back as a BYTES tensor of the top K "value:index[:label]" strings, one row per
batch entry ([batch, K]; [K] for a model that does not batch), in place of its values.

As Triton's TopkClassifications (src/classification.cc): the values are compared as
their own type, K is capped at the entries there are, each value is written as C++'s
std::to_string writes it (integers in decimal, FP32 and FP64 as "%f"), the label is the
output's ``label_filename`` line of that index when there is one, and only the integer
types, FP32 and FP64 can be ranked. Equal values keep their index order (Triton's sort
leaves that unspecified).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import numpy as np

from shoal.configs.model_spec import ModelSpec

#: The datatypes Triton ranks (its switch): integers, written in decimal, and floats (%f).
_INTEGER: Final = frozenset(
    ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")
)
_FLOAT: Final = frozenset(("FP32", "FP64"))


def labels_of(spec: ModelSpec, model_dir: Path) -> dict[str, list[str]]:
    """Each output's labels, from the file its ``label_filename`` names in the model's
    directory, one per line (Triton's label provider; an empty line is no label). A file
    that cannot be read fails the load, as in Triton."""
    labels: dict[str, list[str]] = {}
    for out in spec.outputs:
        if out.label_filename:
            path = model_dir / out.label_filename
            try:
                labels[out.name] = parse_labels(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(
                    f"failed to read labels of output '{out.name}' from '{path}': {exc}"
                ) from None
    return labels


def parse_labels(text: str) -> list[str]:
    """A label file's labels: one per line, as getline reads them (an empty line is no
    label; no line after a final newline)."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def top_k(
    values: np.ndarray, count: int, datatype: str, batched: bool, labels: list[str] | None
) -> np.ndarray:
    """The classification tensor (object array of bytes) of one request's output."""
    text: Callable[[Any], str]
    if datatype in _INTEGER:
        text = str
    elif datatype in _FLOAT:
        text = "{:f}".format
    else:
        raise ValueError(
            f"class result not available for output due to unsupported type '{datatype}'"
        )
    rows = values.reshape(values.shape[0], -1) if batched else values.reshape(1, -1)
    k = min(count, rows.shape[1])
    out = np.empty((rows.shape[0], k), dtype=object)
    for r, row in enumerate(rows):
        ranked = row.tolist()
        for c, i in enumerate(heapq.nlargest(k, range(len(ranked)), key=ranked.__getitem__)):
            s = f"{text(ranked[i])}:{i}"
            if labels is not None and i < len(labels) and labels[i]:  # "": no label
                s += f":{labels[i]}"
            out[r, c] = s.encode()
    return out if batched else out.reshape(k)
