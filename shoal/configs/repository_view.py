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
With namespacing, each is served under a qualified name (shoal/configs/namespaces.py), and
the configs that must name it so are rewritten in the view (a folder of links to the
model's files beside its rewritten config.pbtxt, for a local repository).

Owner: the launcher makes the view and syncs it before any other role starts, and
removes it at exit (shoal/repository_cache.py); then the broker keeps it in step
(shoal/broker/repository_sync.py), one sync at a time. What is on disk between syncs is all a
reader sees: readers never block on the network.
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

from shoal.configs import namespaces
from shoal.configs.object_store import (
    ObjectStore,
    RemoteLocation,
    StorageError,
    is_remote,
    open_store,
)
from shoal.configs.schema import NON_VERSION_DIRS

log = logging.getLogger(__name__)

_MANIFEST = ".shoal-manifest.json"
_REWRITE = ".shoal-rewrite.json"  # in a model's folder whose config the view rewrote


class RepositoryError(Exception):
    """A repository cannot be served (unreadable, missing, a name in two of them)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


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

    def __init__(self, locations: list[str], root: Path, *, namespacing: bool = False) -> None:
        self.locations = locations
        self.root = root
        self.namespacing = namespacing
        self._models: dict[int, set[str]] = {}  # repository -> its model names (last sync)
        self._served: dict[str, tuple[int, str]] = {}  # served name -> (repository, model)
        self._remotes: dict[int, _Remote] = {}
        self._copies: dict[str, _Copy] = {}
        self.errors: dict[str, str] = {}  # model -> why its last fetch failed
        self.list_errors: dict[int, str] = {}  # repository -> why its last listing failed
        self._load_manifest()

    def has(self, name: str) -> bool:
        """Whether the view holds ``name`` whole (linked, or its copy whole)."""
        copy = self._copies.get(name)
        return (self.root / name).is_dir() and (copy is None or copy.whole)

    def problem(self, name: str) -> str:
        """Why ``name`` cannot load from the view as the last sync left it ("": it can):
        its repository could not be listed (a load must not use a copy the storage may no
        longer hold), its files could not be fetched, or no repository has it."""
        where = self._served.get(name)
        if where is not None and where[0] in self.list_errors:
            return self.list_errors[where[0]]
        if name in self.errors:
            return self.errors[name]
        if self.has(name):
            return ""
        if self.list_errors:  # (it may be in the repository that could not be read)
            return "; ".join(self.list_errors.values())
        return "not found in any model repository"

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
        listed: dict[int, dict[str, tuple[int, dict[str, str]]]] = {}
        self.list_errors = {}
        for index, location in enumerate(self.locations):
            try:
                models = self._models_of(index, location)
            except (StorageError, OSError) as exc:
                message = exc.message if isinstance(exc, StorageError) else str(exc)
                if strict:
                    raise RepositoryError(message) from None
                log.warning("cannot read model repository %s: %s", location, message)
                self.list_errors[index] = message
                models = self._held(index, location)
            listed[index] = models
            for name, (_, files) in models.items():
                seen.setdefault(name, []).append(index)
                found.setdefault(name, (index, files))
        self._models = {i: set(models) for i, models in listed.items()}
        if self.namespacing:  # each under its served name: a name in several, qualified
            self._served = namespaces.served_names(self._models)
            return {s: (i, listed[i][n][1]) for s, (i, n) in self._served.items()}
        for name, where in seen.items():
            if len(where) > 1:
                message = f"failed to poll model '{name}': not unique across all model repositories"
                if strict:
                    raise RepositoryError(message)
                log.error("%s", message)
                found.pop(name, None)
        self._served = {name: (index, name) for name, (index, _) in found.items()}
        return found

    def _held(self, index: int, location: str) -> dict[str, tuple[int, dict[str, str]]]:
        """What the view holds now of the repository ``index`` (it could not be read)."""
        if is_remote(location):
            return {n: (index, c.files) for n, c in self._copies.items() if c.source == index}
        inside = str(Path(location).resolve())
        return {
            namespaces.plain(e.name): (index, {})
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
            model = self._served[name][1]
            try:
                if not is_remote(location):
                    if self._place_local(name, Path(location) / model, index):
                        changed.add(name)
                    continue
                old = self._copies.get(name)
                whole = wanted is None or name in wanted or (old is not None and old.whole)
                if old is None or old.files != files or old.source != index or whole > old.whole:
                    self._fetch(name, model, index, files, whole)
                    changed.add(name)
                if self.namespacing and self._rewrite_copy(name, index):
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

    def _place_local(self, name: str, source: Path, index: int) -> bool:
        """Link the model's folder, or with namespacing make one of links beside the
        rewritten config if it needs one; whether the entry changed."""
        text = None
        if self.namespacing:
            config = source / "config.pbtxt"
            original = config.read_text(encoding="utf-8") if config.is_file() else None
            text = namespaces.rewrite_config(original, name, index, self._models)
        if text is None:
            return self._link(name, source)
        target = self.root / name
        want = {"source": str(source.resolve()), "stamp": _newest(source), "config": text}
        with contextlib.suppress(OSError, ValueError):
            if not target.is_symlink() and json.loads((target / _REWRITE).read_text()) == want:
                return False
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=self.root))
        for child in source.iterdir():
            if child.name != "config.pbtxt":
                (staging / child.name).symlink_to(child.resolve())
        (staging / "config.pbtxt").write_text(text)
        (staging / _REWRITE).write_text(json.dumps(want))
        self._swap(staging, target)
        self._copies.pop(name, None)
        return True

    def _rewrite_copy(self, name: str, index: int) -> bool:
        """With namespacing: write (or undo) the rewritten config of a remote model's
        copy; whether it changed. The original is kept beside it, for the next sync."""
        path = self.root / name
        marker, config = path / _REWRITE, path / "config.pbtxt"
        state = json.loads(marker.read_text()) if marker.is_file() else None
        if state is not None:
            original = state["original"]
        else:
            original = config.read_text(encoding="utf-8") if config.is_file() else None
        text = namespaces.rewrite_config(original, name, index, self._models)
        if text is None:
            if state is None:
                return False
            if original is None:
                config.unlink(missing_ok=True)
            else:
                config.write_text(original)
            marker.unlink()
            return True
        if state is not None and state["config"] == text:
            return False
        config.write_text(text)
        marker.write_text(json.dumps({"original": original, "config": text}))
        return True

    def _link(self, name: str, target: Path) -> bool:
        link = self.root / name
        if link.is_symlink() and os.readlink(link) == str(target.resolve()):
            return False
        _remove(link)
        self._copies.pop(name, None)
        link.symlink_to(target.resolve(), target_is_directory=True)
        return True

    def _fetch(self, name: str, model: str, index: int, files: dict[str, str], whole: bool) -> None:
        """Download the objects of ``model`` (whole, or what lies beside its version
        folders) into a hidden folder, then put it in place of the old copy ``name``."""
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
                same = old is not None and old.whole and old.files.get(rel) == tag
                if same and rel != "config.pbtxt" and kept.is_file():
                    shutil.copy2(kept, dest)  # unchanged: not downloaded again
                    continue
                key = "/".join(p for p in (remote.loc.prefix, model, rel) if p)
                remote.store.download(key, dest)
            self._swap(staging, self.root / name)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self._copies[name] = _Copy(index, dict(files), whole)
        log.info("fetched model '%s' from %s%s", name, remote.loc.display(model),
                 "" if whole else " (its config only)")  # fmt: skip

    def _swap(self, staging: Path, target: Path) -> None:
        """Put the folder ``staging`` in place of ``target`` (a rename each)."""
        trash = self.root / f".old-{target.name}-{os.getpid()}"
        _remove(trash)
        if target.is_symlink():
            target.unlink()
        elif target.exists():
            target.rename(trash)
        staging.rename(target)
        _remove(trash)

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


def _newest(path: Path) -> int:
    """The newest modification time (ns) of ``path`` or anything under it."""
    newest = path.stat().st_mtime_ns
    for root, dirs, files in os.walk(path):
        for entry in [*dirs, *files]:
            with contextlib.suppress(OSError):
                newest = max(newest, os.stat(os.path.join(root, entry)).st_mtime_ns)
    return newest


def _in_version_dir(parts: tuple[str, ...]) -> bool:
    """Whether a model's file (its path inside the model) lies in a version folder."""
    return len(parts) > 1 and parts[0] not in NON_VERSION_DIRS and parts[0].isdigit()


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    elif path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
