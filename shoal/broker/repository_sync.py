"""The broker's side of a repository view (shoal/configs/repository_view.py): a thread that
syncs it, so that the broker's turn never waits on object storage.

`kick` asks for a sync (poll mode's rescans, the repository index); `fetched` asks for
one model's whole copy (a load through the API) and says once a sync that began after
the asking has finished, with its error if the model could not be fetched. An
ensemble's composing models are fetched whole with it. Calls come from the broker's
thread only; the sync thread owns the view's folder. Syncs run one at a time.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from shoal.configs.repository_view import RepositoryView

log = logging.getLogger("shoal.broker.repository")


class RepositorySync:
    def __init__(self, view: RepositoryView, *, whole: bool) -> None:
        """``whole``: every model's copy whole (modes none and poll: all of them load);
        else only those a load asked for, and those already whole."""
        self.view = view
        self.whole = whole
        self._cond = threading.Condition()
        self._asked = 0  # tickets handed out
        self._done = 0  # the newest ticket a finished sync covered
        self._wanted: set[str] = set()
        self._tickets: dict[str, int] = {}  # model -> the ticket its fetch waits for
        self._errors: dict[str, str] = {}
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="repository-sync", daemon=True)
        self._thread.start()

    def kick(self) -> int:
        """Ask for a sync (one already asked for and not begun covers this one too)."""
        with self._cond:
            self._asked += 1
            self._cond.notify()
            return self._asked

    def fetched(self, name: str) -> tuple[bool, str]:
        """(whether ``name`` has been fetched since it was first asked for, why it could
        not be or ""). Asks for the fetch the first time."""
        with self._cond:
            ticket = self._tickets.get(name)
            if ticket is None:
                self._wanted.add(name)
                self._errors.pop(name, None)
                self._asked += 1
                self._tickets[name] = self._asked
                self._cond.notify()
                return False, ""
            if self._done < ticket:
                return False, ""
            del self._tickets[name]
            return True, self._errors.pop(name, "")

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=1.0)  # (a sync under way ends with its timeouts)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and self._done >= self._asked:
                    self._cond.wait()
                if self._stop:
                    return
                ticket = self._asked
                wanted = set(self._wanted)
            errors = self._sync(wanted)
            with self._cond:
                self._errors.update(errors)
                self._done = ticket

    def _sync(self, wanted: set[str]) -> dict[str, str]:
        """One sync; the models asked for that are still not whole, and why."""
        try:
            while True:
                self.view.sync(None if self.whole else wanted)
                more = {d for n in wanted for d in _composing(self.view.root / n)} - wanted
                if not more:
                    break
                wanted |= more
                with self._cond:
                    self._wanted |= more
        except Exception as exc:  # a bug must not end the thread: the next sync retries
            log.exception("repository sync failed")
            return dict.fromkeys(wanted, str(exc))
        return {n: why for n in wanted if (why := self.view.problem(n))}


def _composing(model_dir: Path) -> list[str]:
    """The models an ensemble's config (in ``model_dir``) names in its steps."""
    from shoal.configs.ensemble import dependencies, is_ensemble
    from shoal.configs.model_config import parse_config_text
    from shoal.configs.schema import ConfigError
    from shoal.configs.spec_reader import read_spec

    try:
        text = (model_dir / "config.pbtxt").read_text()
        config = read_spec(parse_config_text(text, model_dir.name))
    except (OSError, ConfigError, UnicodeDecodeError):
        return []
    return [d.model for d in dependencies(config)] if is_ensemble(config) else []
