"""Progress of a node's long work (PROGRESS): a tqdm bar on a terminal, plain log lines elsewhere.

``auto`` (the default) draws bars when standard error is a terminal and writes lines otherwise: a node started by
``swarm-gdrive demo`` or a notebook has its output captured line by line, and a log file wants no carriage
returns. ``lines`` always writes lines, ``bars`` always draws, ``off`` writes neither (the work's own summary
lines stay). In lines mode a piece of work says where it stands every :data:`LINE_EVERY_S` seconds, and what it
did when it ends if it took at least :data:`SUMMARY_AFTER_S`.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import TextIO

MODES = ("auto", "bars", "lines", "off")
LINE_EVERY_S = 30.0
SUMMARY_AFTER_S = 2.0

_mode = "auto"
logger = logging.getLogger("swarm_gdrive.progress")


def configure(mode: str) -> None:
    """Set the node's PROGRESS mode (one of :data:`MODES`)."""
    global _mode
    if mode not in MODES:
        raise ValueError(f"PROGRESS={mode!r}: use one of {', '.join(MODES)}")
    _mode = mode


def quiet_libraries(environ: MutableMapping[str, str] | None = None, stream: TextIO | None = None) -> bool:
    """Where this node draws no bars, keep Hugging Face's libraries from drawing theirs (weight loading, the GGUF
    conversion, downloads: carriage returns in a log) unless HF_HUB_DISABLE_PROGRESS_BARS says otherwise; call it
    before transformers is imported. True when it turned them off."""
    environ = os.environ if environ is None else environ
    if _mode != "off" and _bars(stream or sys.stderr):
        return False
    if "HF_HUB_DISABLE_PROGRESS_BARS" in environ:
        return False
    environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    return True


def _bars(stream: TextIO) -> bool:
    if _mode == "auto":
        isatty = getattr(stream, "isatty", None)
        return bool(isatty and isatty())
    return _mode == "bars"


class Task:
    """One piece of work of ``total`` units; :meth:`advance` as units are done."""

    def __init__(self, what: str, total: int, unit: str, stream: TextIO | None = None) -> None:
        self.what, self.total, self.unit = what, total, unit
        self.done = 0
        self.started = self._last_line = time.monotonic()
        stream = stream or sys.stderr
        self._bar = None
        if _mode != "off" and _bars(stream):
            from tqdm.auto import tqdm  # transformers and huggingface_hub need it too

            self._bar = tqdm(
                total=total, desc=what, unit=unit, unit_scale=unit == "B", leave=False, file=stream, dynamic_ncols=True
            )

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if _mode != "off" and now - self._last_line >= LINE_EVERY_S and self.done < self.total:
            self._last_line = now
            left = (now - self.started) / self.done * (self.total - self.done) if self.done else float("nan")
            logger.info(
                "%s: %s of %s, %.0f s so far, about %.0f s left",
                *(self.what, self._amount(self.done), self._amount(self.total), now - self.started, left),
            )

    def close(self) -> float:
        """End the work; its duration in seconds."""
        seconds = time.monotonic() - self.started
        if self._bar is not None:
            self._bar.close()
        elif _mode != "off" and seconds >= SUMMARY_AFTER_S:
            rate = self._amount(self.done / seconds if seconds > 0 else 0.0)
            logger.info("%s: %s in %.1f s (%s a second)", self.what, self._amount(self.done), seconds, rate)
        return seconds

    def _amount(self, n: float) -> str:
        if self.unit == "B":
            return f"{n / 1e6:.1f} MB"
        shown = f"{n:.0f}" if n == int(n) or n >= 10 else f"{n:.2f}"
        if shown == "1":
            return f"1 {self.unit}"
        return f"{shown} {self.unit}{'es' if self.unit.endswith(('ch', 'sh', 's', 'x')) else 's'}"


@contextmanager
def task(what: str, total: int, unit: str, stream: TextIO | None = None) -> Iterator[Task]:
    """A :class:`Task` closed when the block ends (its summary written even if the block raised)."""
    work = Task(what, total, unit, stream)
    try:
        yield work
    finally:
        work.close()


def round_line(round_: int, max_rounds: int, reward: float | None, seconds: float, recent: list[float]) -> str:
    """The line a worker writes as a round ends: the round (0-based, as the logs' ``r`` shows it), which of N it
    was, its reward and time, and the time left at the mean of the ``recent`` rounds' lengths."""
    left = max(max_rounds - round_ - 1, 0)
    shown = "no reward" if reward is None else f"reward {reward:.3f}"
    text = f"round {round_} done ({round_ + 1} of {max_rounds}, {shown}, {seconds:.1f} s)"
    if left and recent:
        eta = sum(recent) / len(recent) * left
        text += f"; {left} to go, about {_duration(eta)} left"
    return text


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
