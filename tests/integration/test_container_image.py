"""The container image (deploy/docker/Dockerfile): its shape, read from the file, always;
and, where podman or buildah is at hand and the base image can be had, the image built and
a request served from a container of it (skipped otherwise, saying why)."""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.serverctl import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = [ROOT / "deploy/docker/Dockerfile", ROOT / "deploy/docker/Dockerfile.gpu"]


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_image_is_multi_stage_unprivileged_and_checked_on_readiness(dockerfile: Path) -> None:
    steps = _instructions(dockerfile)
    froms = [args for word, args in steps if word == "FROM"]
    assert len(froms) == 2 and froms[0].endswith(" AS build"), froms
    # the same set-up as on a host
    assert ("RUN", "scripts/setup.sh && rm -rf .venv/pip-install.log") in steps
    for word, args in steps:
        if word == "COPY" and not args.startswith("--from"):
            for source in args.split()[:-1]:
                assert (ROOT / source).exists(), f"COPY of a missing {source}"
    last = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    users = [args for word, args in steps[last:] if word == "USER"]
    assert users == ["shoal"]
    assert ("VOLUME", "/models") in steps
    assert ("EXPOSE", "8000 8001 8002") in steps
    (check,) = [args for word, args in steps if word == "HEALTHCHECK"]
    assert "/v2/health/ready" in check
    assert ("CMD", '["--model-repository=/models"]') in steps


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_where_pip_looks_is_a_build_arg_of_the_build_stage_only(dockerfile: Path) -> None:
    """A build without PyPI (a mirror, local wheels, a proxy's CA) passes pip's variables
    as build args; the Dockerfile names no host's paths, and the image that runs keeps
    none of them."""
    steps = _instructions(dockerfile)
    last = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    declared = {
        args.split("=")[0] for word, args in steps[:last] if word == "ARG" and "PIP_" in args
    }
    assert declared == {
        "PIP_INDEX_URL",
        "PIP_EXTRA_INDEX_URL",
        "PIP_FIND_LINKS",
        "PIP_CERT",
        "PIP_CONSTRAINT",
    }
    assert not [args for word, args in steps[last:] if "PIP_" in args]
    assert "file://" not in dockerfile.read_text()


def _builder() -> tuple[str, str]:
    """(builder, runner) commands; skips where none is installed."""
    podman = shutil.which("podman")
    buildah = shutil.which("buildah")
    if podman is None and buildah is None:
        pytest.skip("no container builder on this machine (neither podman nor buildah)")
    if podman is None:
        pytest.skip("buildah builds the image but no podman is here to run it")
    return (podman if buildah is None else buildah), podman


def _base_image(podman: str) -> str:
    """The Dockerfile's base image, pulled if missing; skips where it cannot be had."""
    arg = next(a for w, a in _instructions(DOCKERFILES[0]) if w == "ARG" and "PYTHON_IMAGE" in a)
    image = arg.split("=", 1)[1]
    if subprocess.run([podman, "image", "exists", image], check=False).returncode == 0:
        return image
    try:
        pulled = subprocess.run(
            [podman, "pull", image], capture_output=True, text=True, timeout=600, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"the base image {image} could not be pulled in 10 minutes")
    if pulled.returncode != 0:
        last = (pulled.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"the base image {image} cannot be had on this machine: {last}")
    return image


@pytest.mark.timeout(3600)
def test_the_cpu_image_builds_and_serves_a_request() -> None:
    builder, podman = _builder()
    _base_image(podman)
    tag = f"localhost/shoal-test:{secrets.token_hex(4)}"
    build = [builder, "build", "--format", "docker", "-f", str(DOCKERFILES[0]), "-t", tag]
    done = subprocess.run([*build, str(ROOT)], capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    port = free_port()
    name = f"shoal-test-{secrets.token_hex(4)}"
    try:
        subprocess.run(
            [
                podman,
                "run",
                "-d",
                "--init",
                "--shm-size=1g",
                "--name",
                name,
                "-p",
                f"127.0.0.1:{port}:8000",
                tag,
            ],
            check=True,
            timeout=120,
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                url = f"http://127.0.0.1:{port}/v2/health/ready"
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        ins = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for i in ins:
            i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
        out = client.infer("simple", ins).as_numpy("OUTPUT0")
        client.close()
        np.testing.assert_array_equal(out, np.full((1, 16), 2))
        user = subprocess.run(
            [podman, "exec", name, "id", "-u"], capture_output=True, text=True, timeout=60
        )
        assert user.stdout.strip() not in ("", "0")
    finally:
        subprocess.run([podman, "rm", "-f", "-t", "45", name], capture_output=True, timeout=120)
        subprocess.run([podman, "rmi", "-f", tag], capture_output=True, timeout=120)
