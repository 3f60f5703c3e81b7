"""The container image (deploy/docker/Dockerfile): its shape, read from the file, always;
and, where podman is at hand and the base image can be had (pulled, or built from Debian's
packages with mmdebstrap), the image built and requests served from a container of it
(skipped otherwise, saying why). The build takes minutes: it is marked ``container``,
which scripts/test.sh leaves out and scripts/container-test.sh runs."""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests import containerctl
from tests.containerctl import Podman, Unavailable
from tests.serverctl import free_ports

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


def _default_base() -> str:
    """The Dockerfile's base image (its PYTHON_IMAGE's default)."""
    arg = next(a for w, a in _instructions(DOCKERFILES[0]) if w == "ARG" and "PYTHON_IMAGE" in a)
    return arg.split("=", 1)[1]


def _build(podman: Podman, base: str, tag: str) -> float:
    """Builds the CPU image as ``tag`` on ``base``; the seconds it took."""
    build = podman.cmd(
        "build",
        # RUN steps without an OCI runtime, cgroups or a network namespace (the host's
        # network, DNS and proxy): what works in VMs and containers too
        "--isolation=chroot",
        # no intermediate image to leave behind
        "--layers=false",
        # OCI images have no HEALTHCHECK
        "--format=docker",
        "-f",
        str(DOCKERFILES[0]),
        "-t",
        tag,
        "--build-arg",
        f"PYTHON_IMAGE={base}",
        *containerctl.pip_build_options(sys.executable),
        str(ROOT),
    )
    started = time.monotonic()
    done = subprocess.run(build, capture_output=True, text=True, timeout=3000, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return time.monotonic() - started


def _start(podman: Podman, tag: str, name: str) -> tuple[int, int, int]:
    """A container of ``tag`` as the docs run one, the shipped models at /models; its
    HTTP, gRPC and metrics ports on this host."""
    http, grpc, metrics = free_ports(3)
    started = podman.call(
        "run",
        "-d",
        "--init",
        "--shm-size=1g",
        *podman.run_args,
        "--name",
        name,
        "-p",
        f"127.0.0.1:{http}:8000",
        "-p",
        f"127.0.0.1:{grpc}:8001",
        "-p",
        f"127.0.0.1:{metrics}:8002",
        "-v",
        f"{ROOT / 'model_repository'}:/models:ro",
        tag,
    )
    assert started.returncode == 0, started.stderr
    return http, grpc, metrics


def _wait_ready(podman: Podman, name: str, url: str, seconds: float) -> None:
    """Until ``url`` (the HEALTHCHECK's endpoint) answers 200; fails with the container's
    log where it stopped or the time ran out."""
    deadline = time.monotonic() + seconds
    state = "running"
    while time.monotonic() < deadline and state == "running":
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        inspect = podman.call("container", "inspect", "--format", "{{.State.Status}}", name)
        state = inspect.stdout.strip()
        time.sleep(0.5)
    logs = podman.call("logs", name).stderr[-4000:]
    pytest.fail(f"{url} not ready in {seconds:.0f} s (container {state}):\n{logs}")


def _infer_simple(client: Any, module: Any) -> np.ndarray:
    ins = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in ins:
        i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    return client.infer("simple", ins).as_numpy("OUTPUT0")


def _serves(http: int, grpc: int, metrics: int) -> None:
    """An inference over HTTP and one over gRPC, and the metrics that count them."""
    client = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
    np.testing.assert_array_equal(_infer_simple(client, httpclient), np.full((1, 16), 2))
    client.close()
    gclient = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
    np.testing.assert_array_equal(_infer_simple(gclient, grpcclient), np.full((1, 16), 2))
    gclient.close()
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10) as r:
        assert b'nv_inference_request_success{model="simple",version="1"}' in r.read()


def _processes(podman: Podman, name: str) -> list[list[str]]:
    """[user, user on the host, command line] of each process in the container."""
    top = podman.call("top", name, "user", "huser", "args")
    assert top.returncode == 0, top.stderr
    return [line.split(None, 2) for line in top.stdout.splitlines()[1:]]


@pytest.mark.container
@pytest.mark.timeout(3600)
def test_the_cpu_image_builds_and_serves_requests() -> None:
    """Build the CPU image, run it as the docs say on free ports, serve HTTP and gRPC
    inferences and metrics, check that every process runs as the image's user and that
    SIGTERM stops it cleanly; the container, the image and an imported base are removed
    after."""
    tag = f"localhost/shoal-test:{secrets.token_hex(4)}"
    name = f"shoal-test-{secrets.token_hex(4)}"
    with contextlib.ExitStack() as cleanup:
        try:
            podman = containerctl.find_podman()
            base = cleanup.enter_context(containerctl.base_image(podman, _default_base()))
            podman = containerctl.able_to_run(podman, base)
        except Unavailable as e:
            pytest.skip(str(e))
        cleanup.callback(podman.call, "rmi", "-f", tag)
        took = _build(podman, base, tag)
        (image,) = json.loads(podman.call("image", "inspect", tag).stdout)
        print(
            f"built in {took:.0f} s on {base}: {image['Size'] / 1e6:.0f} MB;"
            f" podman {' '.join(podman.global_args)} run {' '.join(podman.run_args)}"
        )
        assert image["Config"]["User"] == "shoal"
        # podman's inspect has the docker format's health check beside the OCI config
        assert "/v2/health/ready" in " ".join(image["Healthcheck"]["Test"])

        cleanup.callback(podman.call, "rm", "-f", "-v", "-t", "45", name, timeout=120)
        http, grpc, metrics = _start(podman, tag, name)
        _wait_ready(podman, name, f"http://127.0.0.1:{http}/v2/health/ready", 300)
        # the image's HEALTHCHECK, run by hand (podman logs errors where no systemd is
        # there to run it on a timer)
        checked = podman.call("healthcheck", "run", name)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        _serves(http, grpc, metrics)
        processes = _processes(podman, name)
        assert any("shoal serve" in args for _, _, args in processes), processes
        assert {(user, host) for user, host, _ in processes} == {("shoal", "10001")}, processes

        # SIGTERM (the STOPSIGNAL): drained and stopped within the wait, exit status 0
        stopped = podman.call("stop", "-t", "45", name, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        code = podman.call("container", "inspect", "--format", "{{.State.ExitCode}}", name)
        assert code.stdout.strip() == "0", podman.call("logs", name).stderr[-4000:]
    assert not podman.exists("container", name)
    assert not podman.exists("image", tag)
    assert base == _default_base() or not podman.exists("image", base)
