"""When the parts of a model directory last changed, as Triton's ModelTimestamp reads
them: what tells a reload which of a loaded model's versions it may keep.

Each entry of the model directory (a version folder, the config, any other file or
folder) is stamped with the newest change of itself and anything under it. A
version is modified when its own folder, or an entry that is neither a version folder nor
the config (a file its versions share: labels, a Python dependency), is newer than when
it loaded; the config is compared by content instead (``reload_needed``). A model none
of whose entries (the config included) is newer than at its load is unmodified: loading
it again changes nothing.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as pb


@dataclass(frozen=True)
class ModelStamps:
    """The stamps (ns) of one model directory's entries, read at one moment."""

    versions: dict[str, int] = field(default_factory=dict)  # version folder (digits) -> stamp
    others: int = 0  # the newest of the entries that are neither versions nor the config
    config: int = 0  # the config's entry (a load with a config of its own: that load's time)
    folder: int = 0  # the model folder itself (entries added or removed)

    @classmethod
    def read(cls, model_dir: Path, config_path: Path | None) -> ModelStamps:
        """The stamps of ``model_dir`` now; ``config_path``: the config file it was read
        from (its entry, ``config.pbtxt`` or ``configs``, is not stamped). An unreadable
        directory reads as all zero: every version is then modified."""
        versions: dict[str, int] = {}
        others = config = folder = 0
        with contextlib.suppress(OSError):
            folder = _changed(model_dir.stat())
            for child in model_dir.iterdir():
                if config_path is not None and config_path.is_relative_to(child):
                    config = newest(child)
                elif child.name.isdigit():
                    versions[child.name] = newest(child)
                else:
                    others = max(others, newest(child))
        return cls(versions, others, config, folder)

    @property
    def latest(self) -> int:
        return max([self.others, self.config, self.folder, *self.versions.values()])

    def modified(self, now: ModelStamps) -> bool:
        """Whether anything of the model (its config too) is newer ``now``, or the folder
        itself is another (a repository view's model that became a link to its source,
        with older files than the copy it was)."""
        return now.latest > self.latest or now.folder != self.folder

    def version_modified(self, now: ModelStamps, version: int) -> bool:
        """Whether ``version`` (or what its versions share) changed between this reading
        and ``now``; a version this reading did not have is modified."""
        key = str(version)
        if key not in self.versions:
            return True
        before = max(self.versions[key], self.others)
        return max(now.versions.get(key, 0), now.others) > before


def reload_needed(old: pb.ModelConfig, new: pb.ModelConfig) -> bool:
    """Whether a loaded version must load again for config ``new``: it differs from
    ``old`` in more than its version policy (Triton also updates instance groups in
    place; shoal starts the version's workers again for those)."""
    a, b = pb.ModelConfig(), pb.ModelConfig()
    a.CopyFrom(old)
    b.CopyFrom(new)
    a.ClearField("version_policy")
    b.ClearField("version_policy")
    return a.SerializeToString(deterministic=True) != b.SerializeToString(deterministic=True)


def newest(path: Path) -> int:
    """The newest change (ns) of ``path`` or anything under it (0: unreadable). A
    change is the later of the modification and the inode change times, as Triton reads
    them: a file copied in with an older modification time (``cp -p``) is still new."""
    latest = 0
    with contextlib.suppress(OSError):
        latest = _changed(os.stat(path))
        for root, dirs, files in os.walk(path):
            for name in [*dirs, *files]:
                with contextlib.suppress(OSError):
                    latest = max(latest, _changed(os.stat(os.path.join(root, name))))
    return latest


def _changed(st: os.stat_result) -> int:
    return max(st.st_mtime_ns, st.st_ctime_ns)
