"""Flag value parsers shared by every role's command line (tritonserver's spellings)."""

from __future__ import annotations

import argparse

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def bool_flag(value: str) -> bool:
    """tritonserver booleans: true/false/1/0 (case-insensitive)."""
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false/1/0), got '{value}'")
