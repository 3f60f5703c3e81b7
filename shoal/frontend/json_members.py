"""JSON objects read member by member, as Triton's JSON layer (RapidJSON) reads them,
where a Python dict would not do: a key written twice, and nesting deeper than a
recursive decoder goes.

Both are for small control bodies (``/generate``, ``/v2/repository/index``): the data
plane's ``/infer`` bodies go through msgspec alone.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

import msgspec


class Members(dict[str, Any]):
    """A JSON object that also keeps its members as written (``pairs``: duplicates too,
    in order), where a dict keeps only the last value of a key."""

    pairs: list[tuple[str, Any]]


def _members(pairs: list[tuple[str, Any]]) -> Members:
    obj = Members(pairs)
    obj.pairs = pairs
    return obj


def read_members(body: bytes, doc: dict[str, Any]) -> dict[str, Any]:
    """``doc``, the body already decoded (and checked), read again so that each object
    keeps its members as written (Members); ``doc`` itself where that reading fails."""
    try:
        again = json.loads(body, object_pairs_hook=_members)
    except (ValueError, RecursionError):
        return doc
    return again if isinstance(again, dict) else doc


def items(obj: dict[str, Any]) -> list[tuple[str, Any]]:
    """An object's members: as written for Members, else the dict's."""
    return obj.pairs if isinstance(obj, Members) else list(obj.items())


class Deep:
    """A member's value too deeply nested to decode: an array or an object, so of no
    scalar type (its type is all a control body's reader asks)."""


DEEP: Final = Deep()
#: A JSON string, or one of the characters that delimit structure outside strings.
_TOKEN: Final = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{},:]')


def shallow_members(body: bytes) -> dict[str, Any] | None:
    """The top-level members of a JSON object, each decoded where it is shallow enough
    and DEEP where it is not; None if the body is no well-formed object. Iterative: a
    body nested 250,000 levels deep (Triton's L0_http test) costs one pass over it."""
    depth, key, start = 0, None, 0
    found: dict[str, bytes] = {}
    for m in _TOKEN.finditer(body):
        t = m.group()
        if t in (b"[", b"{"):
            depth += 1
            if depth == 1 and t != b"{":
                return None
        elif t in (b"]", b"}"):
            depth -= 1
            if depth == 0:
                if key is not None:
                    found[key] = body[start : m.start()]
                return _decoded(found) if not body[m.end() :].strip() else None
        elif depth == 1:
            if t.startswith(b'"') and key is None:
                key = json.loads(t)
            elif t == b":":
                start = m.end()
            elif t == b"," and key is not None:
                found[key] = body[start : m.start()]
                key = None
    return None


def _decoded(found: dict[str, bytes]) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    for k, raw in found.items():
        try:
            out[k] = msgspec.json.decode(raw)
        except RecursionError:
            out[k] = DEEP
        except msgspec.DecodeError:
            return None
    return out
