"""What ``shoal analyze`` shows while it runs, on stderr.

Every event is a line that stays (``note``: ``[analyze] ...``), so a log or a CI job
keeps the whole story. On a terminal a live line under them also shows how far the
search is: a bar filled to whichever of its two limits is nearer (points measured of
``--max-points``, seconds spent of ``--budget-secs``), the point being measured and its
last numbers. The bar is rich's where rich is installed, else a small one drawn here.
"""

from __future__ import annotations

import shutil
import sys
from typing import Any, TextIO

_WIDTH = 24  # the bar's cells (ours)


def fraction(points: int, max_points: int, spent_s: float, budget_s: float) -> float:
    """How far the search is, 0..1: the nearer of its two limits."""
    by_points = points / max_points if max_points > 0 else 0.0
    by_time = spent_s / budget_s if budget_s > 0 else 0.0
    return min(1.0, max(by_points, by_time))


def live_line(done: float, points: int, max_points: int, spent_s: float, budget_s: float,
              doing: str, width: int) -> str:  # fmt: skip
    """Our live line: ``[#####.....]  42%  point 3/40  12 s/300 s  <doing>``, cut to
    ``width`` columns."""
    full = round(done * _WIDTH)
    bar = "#" * full + "." * (_WIDTH - full)
    text = (f"[{bar}] {done * 100:3.0f}%  point {points}/{max_points}  "
            f"{spent_s:.0f} s/{budget_s:.0f} s  {doing}")  # fmt: skip
    return text[: max(10, width - 1)]


class Progress:
    """The analyzer's progress (one thread). ``live``: draw the live line (default: when
    ``stream`` is a terminal)."""

    def __init__(
        self, max_points: int, budget_s: float, stream: TextIO | None = None,
        live: bool | None = None,
    ) -> None:  # fmt: skip
        self.stream = stream if stream is not None else sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.max_points, self.budget_s = max_points, budget_s
        self.points, self.spent_s, self.doing = 0, 0.0, ""
        self._rich: Any = None
        self._task: Any = None
        if self.live:
            self._rich_start()

    def _rich_start(self) -> None:
        try:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn
        except ImportError:  # ours, then
            return
        console = Console(file=self.stream)
        self._rich = Progress(
            BarColumn(), TextColumn("{task.percentage:>3.0f}%  {task.description}"),
            console=console, transient=True,
        )  # fmt: skip
        self._task = self._rich.add_task("", total=1.0)
        self._rich.start()

    def note(self, message: str) -> None:
        """A line that stays; the live line is drawn again under it."""
        line = f"[analyze] {message}"
        if self._rich is not None:
            self._rich.console.print(line, markup=False, highlight=False)
        elif self.live:
            self.stream.write("\r\x1b[2K" + line + "\n")
            self._draw()
        else:
            print(line, file=self.stream, flush=True)

    def point(self, points: int, spent_s: float, doing: str) -> None:
        """The search's state: ``points`` started so far, ``spent_s`` of its budget, and
        what it is measuring."""
        self.points, self.spent_s, self.doing = points, spent_s, doing
        if self.live:
            self._draw()

    def _draw(self) -> None:
        done = fraction(self.points, self.max_points, self.spent_s, self.budget_s)
        if self._rich is not None:
            what = f"point {self.points}/{self.max_points}  {self.spent_s:.0f} s/"
            what += f"{self.budget_s:.0f} s  {self.doing}"
            self._rich.update(self._task, completed=done, description=what)
            return
        width = shutil.get_terminal_size((100, 20)).columns
        line = live_line(done, self.points, self.max_points, self.spent_s, self.budget_s,
                         self.doing, width)  # fmt: skip
        self.stream.write("\r\x1b[2K" + line)
        self.stream.flush()

    def close(self) -> None:
        """The live line goes; the lines that stay are what is left."""
        if self._rich is not None:
            self._rich.stop()
            self._rich = None
        elif self.live:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
        self.live = False
