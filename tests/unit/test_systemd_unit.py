"""deploy/systemd/shoal.service: systemd's own check of the unit (where systemd-analyze
is installed), and the settings the stop order depends on."""

from __future__ import annotations

import argparse
import configparser
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shoal.cli import serve_parser

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy/systemd/shoal.service"
INSTALLED = "/opt/shoal/.venv/bin/shoal"


def _service() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser["Service"]


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here: the unit is not verified")
    # verify wants ExecStart's program to exist: this checkout's, where /opt/shoal is not
    here = str(Path(sys.executable).with_name("shoal"))
    unit = tmp_path / "shoal.service"
    unit.write_text(UNIT.read_text().replace(INSTALLED, here))
    done = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    # a setting systemd cannot read is only a warning: any line about the unit fails it
    about = [line for line in done.stderr.splitlines() if "shoal.service" in line]
    assert done.returncode == 0 and not about, done.stderr


def test_the_unit_stops_the_launcher_alone_and_waits_longer_than_its_stop() -> None:
    service = _service()
    # systemd signals the launcher only: it stops the frontends first, then the rest
    assert service["KillMode"] == "mixed"
    assert service["KillSignal"] == "SIGTERM"
    argv = shlex.split(service["ExecStart"].replace("$SHOAL_ARGS", ""))
    assert argv[0] == INSTALLED and argv[1] == "serve"
    args = serve_parser(argparse.ArgumentParser().add_subparsers()).parse_args(argv[2:])
    assert args.runtime_dir == f"/run/{service['RuntimeDirectory']}"
    # the frontends' drain, then the broker and the workers (10 s), with time to spare
    assert int(service["TimeoutStopSec"]) >= args.exit_timeout_secs + 10 + 5
