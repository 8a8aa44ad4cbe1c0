"""An eval's progress: a rich bar with the running official EX on a terminal; plain lines with the time left where
stderr is not one (a log file, nohup, CI, Slurm)."""

from __future__ import annotations

import time

PROGRESS_LINE_SECONDS = 30  # without a terminal (a log file, nohup, CI, Slurm): a progress line at most this often


class Progress:
    """A rich progress bar with the running official EX on a terminal; where stderr is not one, a plain line at most
    every ``PROGRESS_LINE_SECONDS`` and at the end, with the time left; silent with ``quiet``."""

    def __init__(self, total: int, done_lines: list[dict], label: str, quiet: bool = False):
        scored = [line["official"] for line in done_lines if line["official"] is not None]
        self.correct = sum(scored)
        self.count = len(scored)
        self.quiet = quiet
        self._progress = None
        self._lines = None
        if quiet:
            return
        from t2s.ui.console import console

        if not console(stderr=True).is_terminal:
            self.total, self.label, self.done = total, label, len(done_lines)
            self._lines = {"start": time.monotonic(), "last": time.monotonic(), "first_done": self.done}
            return
        from rich.progress import (
            BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn, TimeRemainingColumn,
        )

        self._progress = RichProgress(
            TextColumn("{task.description}", style="bold", markup=False), BarColumn(), MofNCompleteColumn(),
            TextColumn("official EX {task.fields[acc]}", markup=False), TimeElapsedColumn(), TimeRemainingColumn(),
            console=console(stderr=True), transient=False,
        )  # fmt: skip
        self._progress.start()
        self._task = self._progress.add_task(label, total=total, completed=len(done_lines), acc=self._acc())

    def _acc(self) -> str:
        return f"{self.correct / self.count:.3f}" if self.count else "-"

    def advance(self, line: dict) -> None:
        if line["official"] is not None:
            self.count += 1
            self.correct += line["official"]
        if self._progress is not None:
            self._progress.update(self._task, advance=1, acc=self._acc())
        elif self._lines is not None:
            self.done += 1
            if time.monotonic() - self._lines["last"] >= PROGRESS_LINE_SECONDS:
                self._say()

    def _say(self) -> None:
        from t2s.ui.console import print_line

        now = time.monotonic()
        self._lines["last"] = now
        elapsed, played = now - self._lines["start"], self.done - self._lines["first_done"]
        left = (f", about {_duration(elapsed / played * (self.total - self.done))} left"
                if played and self.done < self.total else "")
        print_line(f"{self.label}: {self.done}/{self.total} episodes, official EX {self._acc()}, "
                   f"{_duration(elapsed)} elapsed{left}", stderr=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        elif self._lines is not None:
            self._say()


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
