"""Bounds on the JSON a frontend takes for the control plane: nesting depth and size.

Pure: no sockets, safe from any thread. msgspec and Python's json stop only at the
interpreter's recursion limit (about 1,000 levels), far past Triton's 100; a document
nested deeper than that raises RecursionError wherever it is parsed. So the frontend
measures the depth itself and refuses, with Triton's 400 words, what Triton refuses,
before anything reaches the broker (whose config parser would otherwise end in its
catch-all, a 500 with a traceback in its log).

The depth counts containers: ``{}`` and ``[]`` are 1, ``{"a": [1]}`` is 2.
"""

from __future__ import annotations

import json
from typing import Final

import msgspec

from shoal.dataplane.json_tensors import depth_exceeded
from shoal.ipc.errors import invalid_arg

#: Triton's limit on JSON nesting (its HTTP server's, since 2025-05).
MAX_JSON_DEPTH: Final = 100
#: The largest model config a load may carry as JSON. Triton has no such limit; over gRPC
#: a message may be 2 GiB, and the broker parses the config on its one loop.
MAX_CONFIG_JSON_BYTES: Final = 4 * 1024 * 1024


def json_depth(doc: object) -> int:
    """The nesting depth of a decoded JSON value (a scalar: 0), walked without recursion
    (the value may be as deep as the parser allowed)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children = list(value.values())
        elif isinstance(value, list):
            children = value
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return deepest


def check_depth(doc: object, max_depth: int = MAX_JSON_DEPTH) -> None:
    """ServingError (INVALID_ARG, Triton's message) when ``doc`` nests deeper than
    ``max_depth``."""
    if json_depth(doc) > max_depth:
        raise depth_exceeded(max_depth)


def check_config_override(config: str) -> None:
    """Refuse a load's ``config`` parameter that is too large or nested too deep, with a
    ServingError (INVALID_ARG: HTTP 400, gRPC INVALID_ARGUMENT). A config that does not
    parse passes: the broker's parser names what is wrong with it, as before."""
    size = len(config.encode(errors="surrogatepass"))
    if size > MAX_CONFIG_JSON_BYTES:
        raise invalid_arg(
            f"model config JSON size of {size} bytes exceeds the maximum allowed value of "
            f"{MAX_CONFIG_JSON_BYTES} bytes"
        )
    try:
        doc = msgspec.json.decode(config)
    except RecursionError:
        raise depth_exceeded(MAX_JSON_DEPTH) from None
    except msgspec.DecodeError:
        # NaN and Infinity, which the broker's json.loads takes, or no JSON at all.
        try:
            doc = json.loads(config)
        except RecursionError:
            raise depth_exceeded(MAX_JSON_DEPTH) from None
        except ValueError:
            return
    check_depth(doc)
