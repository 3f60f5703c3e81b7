"""HTTP-only benchmark, kept for its old command line: ``run.py`` with HTTP defaults.

Same as ``python bench/run.py --protocols http --frontends 1 --concurrency 1,8 ...``; any
option of ``run.py`` may follow and overrides these defaults.

    python bench/run_http.py [--with-triton-peer | --peer-url HOST:PORT] [--no-shoal]
"""

from __future__ import annotations

import sys

import run

HTTP_DEFAULTS = ["--protocols", "http", "--frontends", "1", "--concurrency", "1,8"]


def main(argv: list[str] | None = None) -> int:
    return run.main([*HTTP_DEFAULTS, *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
