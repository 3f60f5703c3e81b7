"""One local model repository made of several (``--model-repository`` given more than
once) and of repositories in object storage: the *view* every role reads.

The view is a folder with one entry per model: a symbolic link to the model's folder in
a local repository, or, for a repository in object storage, a local copy (a cache, as
Triton downloads a model's folder when it loads it). A copy is whole for the models that
load (`sync`'s ``wanted``; once whole it stays so); the others get only what their
listing and index need: the files beside the version folders (config.pbtxt, configs/,
labels) and empty version folders. A model's copy is replaced in one rename when its
objects change, so that a rescan (poll mode) sees a changed model at once and whole.

The same model name in two repositories is an error (Triton's, without
``--model-namespacing``): at start it stops the server; later the model is left out.

Owner: the launcher makes the view and syncs it before any other role starts, and
removes it at exit; then the broker keeps it in step (`RepositorySync`), one sync at a
time. What is on disk between syncs is all a reader sees: readers never block on the
network. The cache's folder name carries the launcher's pid, so the next start removes
what a killed server left (`sweep_stale`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from configs.object_store import ObjectStore, RemoteLocation, StorageError, is_remote, open_store
from configs.schema import NON_VERSION_DIRS

log = logging.getLogger(__name__)

CACHE_PREFIX = "shoal-models-"
_MANIFEST = ".shoal-manifest.json"


class RepositoryError(Exception):
    """A repository cannot be served (unreadable, missing, a name in two of them)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def needs_view(locations: list[str]) -> bool:
    """Whether these --model-repository values need a view (else the one local folder
    is read as it is)."""
    return len(locations) > 1 or any(is_remote(loc) for loc in locations)


def cache_dir(pid: int | None = None) -> Path:
    """The view's folder for the launcher ``pid`` (this process by default)."""
    return Path(tempfile.gettempdir()) / f"{CACHE_PREFIX}{pid or os.getpid()}"


def sweep_stale() -> list[Path]:
    """Remove the views of servers that are gone (their launcher's pid is dead)."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{CACHE_PREFIX}*"):
        pid = path.name.removeprefix(CACHE_PREFIX)
        if not pid.isdigit() or _alive(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class _Remote:
    loc: RemoteLocation
    store: ObjectStore


@dataclass
class _Copy:
    """What the view holds of a remote model: its objects' tags, and whether whole."""

    source: int
    files: dict[str, str] = field(default_factory=dict)
    whole: bool = False


class RepositoryView:
    """The view of ``locations`` (local folders, object storage URLs) in ``root``."""

    def __init__(self, locations: list[str], root: Path) -> None:
        self.locations = locations
        self.root = root
        self._remotes: dict[int, _Remote] = {}
        self._copies: dict[str, _Copy] = {}
        self.errors: dict[str, str] = {}  # model -> why its last fetch failed
        self._load_manifest()

    def has(self, name: str) -> bool:
        """Whether the view holds ``name`` whole (linked, or its copy whole)."""
        path = self.root / name
        if path.is_symlink():
            return path.is_dir()
        copy = self._copies.get(name)
        return copy is not None and copy.whole and path.is_dir()

    def _remote(self, index: int) -> _Remote:
        if index not in self._remotes:
            loc = RemoteLocation.parse(self.locations[index])
            self._remotes[index] = _Remote(loc, open_store(loc))
        return self._remotes[index]

    # -- listing ---------------------------------------------------------------------

    def _list(self, strict: bool) -> dict[str, tuple[int, dict[str, str]]]:
        """model -> (the repository that has it, its objects (remote) or {} (local)).
        ``strict``: an unreadable repository or a name in two is an error; else logged,
        and the models of an unreadable repository are kept as they are."""
        found: dict[str, tuple[int, dict[str, str]]] = {}
        seen: dict[str, list[int]] = {}
        for index, location in enumerate(self.locations):
            try:
                models = self._models_of(index, location)
            except (StorageError, OSError) as exc:
                message = exc.message if isinstance(exc, StorageError) else str(exc)
                if strict:
                    raise RepositoryError(message) from None
                log.warning("cannot read model repository %s: %s", location, message)
                models = self._held(index, location)
            for name, (_, files) in models.items():
                seen.setdefault(name, []).append(index)
                found.setdefault(name, (index, files))
        for name, where in seen.items():
            if len(where) > 1:
                message = f"failed to poll model '{name}': not unique across all model repositories"
                if strict:
                    raise RepositoryError(message)
                log.error("%s", message)
                found.pop(name, None)
        return found

    def _held(self, index: int, location: str) -> dict[str, tuple[int, dict[str, str]]]:
        """What the view holds now of the repository ``index`` (it could not be read)."""
        if is_remote(location):
            return {n: (index, c.files) for n, c in self._copies.items() if c.source == index}
        inside = str(Path(location).resolve())
        return {
            e.name: (index, {})
            for e in self.root.iterdir()
            if e.is_symlink() and os.readlink(e).startswith(inside + os.sep)
        }

    def _models_of(self, index: int, location: str) -> dict[str, tuple[int, dict[str, str]]]:
        if not is_remote(location):
            path = Path(location)
            if not path.is_dir():
                raise RepositoryError(f"failed to stat file {location}")
            return {
                c.name: (index, {})
                for c in path.iterdir()
                if c.is_dir() and not c.name.startswith(".")
            }
        remote = self._remote(index)
        objects = remote.store.list(remote.loc.prefix)
        if not objects:
            raise StorageError(f"failed to stat file {remote.loc.display()}")
        models: dict[str, tuple[int, dict[str, str]]] = {}
        for key, tag in objects.items():
            name, sep, rest = key.partition("/")
            if sep and rest and not name.startswith("."):
                models.setdefault(name, (index, {}))[1][rest] = tag
        return models

    # -- syncing ---------------------------------------------------------------------

    def sync(self, wanted: set[str] | None = None, *, strict: bool = False) -> set[str]:
        """Bring the view in step with the repositories: new models appear, removed ones
        go, a changed copy is fetched again. ``wanted``: the models whose remote copies
        must be whole (None: all). Returns the names of the models that changed.
        Raises RepositoryError if ``strict`` and a repository cannot be read; a model
        whose files cannot be fetched is left as it was (and logged) unless ``strict``."""
        self.root.mkdir(parents=True, exist_ok=True)
        found = self._list(strict)
        changed: set[str] = set()
        for entry in sorted(self.root.iterdir()):
            if entry.name.startswith("."):
                continue
            if entry.name not in found:
                _remove(entry)
                self._copies.pop(entry.name, None)
                changed.add(entry.name)
        for name, (index, files) in sorted(found.items()):
            location = self.locations[index]
            try:
                if not is_remote(location):
                    if self._link(name, Path(location) / name):
                        changed.add(name)
                    continue
                old = self._copies.get(name)
                whole = wanted is None or name in wanted or (old is not None and old.whole)
                if old is None or old.files != files or old.source != index or whole > old.whole:
                    self._fetch(name, index, files, whole)
                    changed.add(name)
                self.errors.pop(name, None)
            except (StorageError, OSError) as exc:
                message = exc.message if isinstance(exc, StorageError) else str(exc)
                if strict:
                    raise RepositoryError(message) from None
                self.errors[name] = message
                log.error("cannot fetch model '%s': %s", name, message)
        self._save_manifest()
        return changed

    def _link(self, name: str, target: Path) -> bool:
        link = self.root / name
        if link.is_symlink() and os.readlink(link) == str(target.resolve()):
            return False
        _remove(link)
        self._copies.pop(name, None)
        link.symlink_to(target.resolve(), target_is_directory=True)
        return True

    def _fetch(self, name: str, index: int, files: dict[str, str], whole: bool) -> None:
        """Download the model's objects (whole, or what lies beside its version folders)
        into a hidden folder, then put it in place of the old copy."""
        remote = self._remote(index)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=self.root))
        try:
            old = self._copies.get(name)
            for rel, tag in sorted(files.items()):
                parts = Path(rel).parts
                if any(p in ("..", ".") for p in parts) or Path(rel).is_absolute():
                    continue
                dest = staging.joinpath(*parts)
                if not whole and _in_version_dir(parts):
                    dest.parent.mkdir(parents=True, exist_ok=True)  # (the version, empty)
                    continue
                dest.parent.mkdir(parents=True, exist_ok=True)
                kept = self.root / name / rel
                if old is not None and old.whole and old.files.get(rel) == tag and kept.is_file():
                    shutil.copy2(kept, dest)  # unchanged: not downloaded again
                    continue
                key = "/".join(p for p in (remote.loc.prefix, name, rel) if p)
                remote.store.download(key, dest)
            target = self.root / name
            trash = self.root / f".old-{name}-{os.getpid()}"
            _remove(trash)
            if target.is_symlink():
                target.unlink()
            elif target.exists():
                target.rename(trash)
            staging.rename(target)
            _remove(trash)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self._copies[name] = _Copy(index, dict(files), whole)
        log.info("fetched model '%s' from %s%s", name, remote.loc.display(name),
                 "" if whole else " (its config only)")  # fmt: skip

    # -- manifest (what the view holds, for the next process that syncs it) ----------

    def _load_manifest(self) -> None:
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            data = json.loads((self.root / _MANIFEST).read_text())
            self._copies = {
                n: _Copy(int(c["source"]), dict(c["files"]), bool(c["whole"]))
                for n, c in data.items()
            }

    def _save_manifest(self) -> None:
        data = {
            n: {"source": c.source, "files": c.files, "whole": c.whole}
            for n, c in self._copies.items()
        }
        tmp = self.root / f"{_MANIFEST}.{os.getpid()}"
        tmp.write_text(json.dumps(data))
        tmp.replace(self.root / _MANIFEST)


def _in_version_dir(parts: tuple[str, ...]) -> bool:
    """Whether a model's file (its path inside the model) lies in a version folder."""
    return len(parts) > 1 and parts[0] not in NON_VERSION_DIRS and parts[0].isdigit()


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    elif path.is_dir():
        shutil.rmtree(path, ignore_errors=True)


def prepare(
    locations: list[str],
    root: Path,
    *,
    mode: str,
    load_models: list[str],
    model_config_name: str = "",
) -> RepositoryView:
    """The launcher's first sync of a view, before any role reads it: every model whole,
    or in explicit mode those that load at start (what --load-model names, with what its
    ensembles use) and the configs of the others. Raises RepositoryError (the server
    cannot start)."""
    from configs import repository
    from configs.model_control import ALL, startup_models

    view = RepositoryView(locations, root)
    wanted: set[str] | None = None
    if mode == "explicit" and ALL not in load_models:
        view.sync(set(), strict=True)  # the configs: which models the named ones use
        level = repository.log.level
        repository.log.setLevel(logging.CRITICAL)  # (half-fetched models: not errors)
        try:
            entries = repository.scan(root, model_config_name=model_config_name)
        finally:
            repository.log.setLevel(level)
        wanted = startup_models(entries, mode, load_models)
    view.sync(wanted, strict=True)
    return view
