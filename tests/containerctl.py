"""Build shoal's container image and run containers of it with podman, for
tests/integration/test_container_image.py, on hosts that lack what a build and a run
usually take for granted. Each fallback is taken only where the usual way fails:

- no container registry: the base image is built from Debian's packages (mmdebstrap,
  the Dockerfile's Debian release and its Python) and imported; the root file system is
  cached in ``~/.cache/shoal-tests`` (``$XDG_CACHE_HOME``), so only a first run builds it;
- pip's packages where this host's pip finds them: its index, extra indexes, wheel
  folders, CA certificate and constraints, as the Dockerfile's build args, local folders
  mounted read-only into the build;
- an OCI runtime that cannot start a container here (crun refuses hybrid cgroups): runc,
  from the PATH or from Debian's package (cached next to the root file system);
- root without CAP_SYS_RESOURCE (a VM's sandbox): limits no higher than this process's.

Everything raises :class:`Unavailable` with the reason where the host cannot do it; the
test skips with that reason.
"""

from __future__ import annotations

import ast
import hashlib
import os
import resource
import shutil
import subprocess
import tempfile
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "shoal-tests"

#: What the Debian-built base holds: what the Dockerfile's stages use from
#: ``python:3.11-slim-bookworm`` (python3 and venv, CA certificates, useradd).
DEBIAN_SUITE = "bookworm"
DEBIAN_PACKAGES = ("python3", "python3-venv", "ca-certificates", "passwd")
DEBIAN_SOURCES = (
    f"deb http://deb.debian.org/debian {DEBIAN_SUITE} main",
    f"deb http://deb.debian.org/debian {DEBIAN_SUITE}-updates main",
    f"deb http://deb.debian.org/debian-security {DEBIAN_SUITE}-security main",
)
#: The image config python's images have and a bare root file system lacks (the
#: Dockerfile's ``ENV PATH=...:$PATH`` extends it).
BASE_CONFIG = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["python3"]',
)
#: pip's settings that say where packages come from: passed to the build as the
#: variables the Dockerfile's build stage declares (``PIP_<NAME>``).
PIP_SOURCES = ("index-url", "extra-index-url", "find-links", "cert", "constraint")


class Unavailable(Exception):
    """This host cannot do it; the message says why."""


def _last_line(text: str) -> str:
    return (text.strip().splitlines() or ["?"])[-1]


@dataclass
class Podman:
    """podman, with the global flags (``--runtime``) and the ``run`` flags (limits) this
    host needs; every command on a container of it goes through :meth:`cmd`."""

    exe: str
    global_args: list[str] = field(default_factory=list)
    run_args: list[str] = field(default_factory=list)

    def cmd(self, *args: str) -> list[str]:
        return [self.exe, *self.global_args, *args]

    def call(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.cmd(*args), capture_output=True, text=True, timeout=timeout, check=False
        )

    def exists(self, kind: str, name: str) -> bool:
        """Whether the ``kind`` ("image", "container") ``name`` exists."""
        return self.call(kind, "exists", name).returncode == 0


def find_podman() -> Podman:
    podman = shutil.which("podman")
    if podman is None:
        if shutil.which("buildah"):
            raise Unavailable("buildah builds the image but no podman is here to run it")
        raise Unavailable("no container builder on this machine (neither podman nor buildah)")
    return Podman(podman, run_args=resource_limit_args())


def resource_limit_args() -> list[str]:
    """``--ulimit`` flags within this process's hard limits. podman asks the runtime for
    1048576 open files and processes where none are given, which root without
    CAP_SYS_RESOURCE may not set ("setrlimit RLIMIT_NOFILE: Operation not permitted"),
    and it lowers its own process limit to 32768 at start, so no higher than that."""
    _, files = resource.getrlimit(resource.RLIMIT_NOFILE)
    _, procs = resource.getrlimit(resource.RLIMIT_NPROC)
    files = 1048576 if files == resource.RLIM_INFINITY else min(files, 1048576)
    procs = 32768 if procs == resource.RLIM_INFINITY else min(procs, 32768)
    return ["--ulimit", f"nofile={files}:{files}", "--ulimit", f"nproc={procs}:{procs}"]


def _can_run(podman: Podman, image: str) -> subprocess.CompletedProcess[str]:
    return podman.call("run", "--rm", "--network=none", *podman.run_args, image, "true")


def able_to_run(podman: Podman, image: str) -> Podman:
    """podman as it starts a container of ``image`` here: with its configured runtime,
    else with runc (crun 1.8 refuses cgroup v1 with v2 controllers beside, "cgroups in
    hybrid mode not supported")."""
    tried = _can_run(podman, image)
    if tried.returncode == 0:
        return podman
    first = _last_line(tried.stderr)
    try:
        runc = shutil.which("runc") or str(debian_runc())
    except Unavailable as e:
        raise Unavailable(f"podman cannot start a container here ({first}); {e}") from None
    with_runc = Podman(podman.exe, [*podman.global_args, "--runtime", runc], podman.run_args)
    tried = _can_run(with_runc, image)
    if tried.returncode != 0:
        raise Unavailable(
            f"podman cannot start a container here ({first}), nor with {runc}"
            f" ({_last_line(tried.stderr)})"
        )
    return with_runc


def debian_runc() -> Path:
    """runc from Debian's package (apt-get download, unpacked; no install), cached."""
    target = CACHE / "runc-debian"
    runc = target / "usr/sbin/runc"
    if runc.exists():
        return runc
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise Unavailable("no runc, and no apt-get to fetch Debian's")
    CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="runc-", dir=CACHE))
    try:
        got = subprocess.run(
            ["apt-get", "download", "-o", "APT::Sandbox::User=root", "runc"],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        debs = list(work.glob("runc_*.deb"))
        if got.returncode != 0 or not debs:
            raise Unavailable(f"no runc, and apt-get download runc failed: {got.stderr}")
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(work / "x")], check=True)
        if not runc.exists():
            (work / "x").replace(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return runc


@contextmanager
def base_image(podman: Podman, image: str) -> Iterator[str]:
    """The base image to build on: ``image`` where it is here or can be pulled (it stays,
    as any pulled image does); else one imported from a Debian root file system built
    with mmdebstrap, removed on exit."""
    if podman.exists("image", image):
        yield image
        return
    try:
        pulled = podman.call("pull", image, timeout=600)
    except subprocess.TimeoutExpired:
        why = f"the base image {image} could not be pulled in 10 minutes"
    else:
        if pulled.returncode == 0:
            yield image
            return
        why = f"the base image {image} cannot be pulled ({_last_line(pulled.stderr)})"
    if shutil.which("mmdebstrap") is None:
        raise Unavailable(f"{why}, and no mmdebstrap is here to build one from Debian")
    rootfs = debian_rootfs()
    name = f"localhost/shoal-test-base:{os.getpid()}-{os.urandom(4).hex()}"
    changes = [arg for change in BASE_CONFIG for arg in ("--change", change)]
    imported = podman.call("import", *changes, str(rootfs), name, timeout=600)
    if imported.returncode != 0:
        raise Unavailable(f"{why}; importing {rootfs} failed: {_last_line(imported.stderr)}")
    try:
        yield name
    finally:
        podman.call("rmi", "-f", name)


def debian_rootfs() -> Path:
    """A root file system tarball of Debian with :data:`DEBIAN_PACKAGES`, built by
    mmdebstrap once per recipe and cached (``rm`` it to take newer packages)."""
    args = [
        "--variant=minbase",
        f"--include={','.join(DEBIAN_PACKAGES)}",
        # what a slim image leaves out
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
    ]
    recipe = hashlib.sha256("\n".join([*args, DEBIAN_SUITE, *DEBIAN_SOURCES]).encode())
    tarball = CACHE / f"debian-{DEBIAN_SUITE}-python3-{recipe.hexdigest()[:12]}.tar"
    if tarball.exists():
        return tarball
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = tarball.with_suffix(f".{os.getpid()}.partial.tar")
    try:
        built = subprocess.run(
            ["mmdebstrap", *args, DEBIAN_SUITE, str(partial), *DEBIAN_SOURCES],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        if built.returncode != 0:
            raise Unavailable(f"mmdebstrap failed: {built.stderr[-2000:]}")
        partial.replace(tarball)
    finally:
        partial.unlink(missing_ok=True)
    return tarball


def pip_build_options(python: str) -> list[str]:
    """``--build-arg PIP_<NAME>=...`` for each of :data:`PIP_SOURCES` this host's pip is
    configured with (its files and ``PIP_*`` variables, as ``pip config list`` shows
    them), and ``-v PATH:PATH:ro`` for each local folder or file they name, so that pip
    in the build finds packages where the host's does."""
    listed = subprocess.run(
        [python, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    settings: dict[str, str] = {}
    for line in listed.stdout.splitlines():
        key, _, value = line.partition("=")
        section, _, name = key.rpartition(".")
        # files first, then the environment's (":env:"), which wins, as in pip
        if section in ("global", ":env:") and name in PIP_SOURCES:
            settings[name] = ast.literal_eval(value)
    options: list[str] = []
    mounts: dict[Path, None] = {}
    for name, value in settings.items():
        options += ["--build-arg", f"PIP_{name.upper().replace('-', '_')}={value}"]
        for item in value.split():
            path = _local_path(item)
            if path is not None and path.exists():
                mounts[path] = None
    for path in mounts:
        options += ["-v", f"{path}:{path}:ro"]
    return options


def _local_path(item: str) -> Path | None:
    """The local file or folder a pip setting's item names: a path, or a ``file://``
    index (the folder above its ``simple/``, whose pages link to files beside it)."""
    if item.startswith("file://"):
        path = Path(urllib.parse.unquote(urllib.parse.urlparse(item).path))
        return path.parent if path.name == "simple" else path
    if item.startswith("/"):
        return Path(item)
    return None
