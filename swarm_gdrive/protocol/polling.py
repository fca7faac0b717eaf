"""Bounded waits: poll with exponential backoff and jitter up to a cap, never a fixed sleep."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from swarm_gdrive.storage.base import StorageUnavailableError

T = TypeVar("T")
logger = logging.getLogger(__name__)


class Stopped(Exception):
    """The node was asked to stop (SIGTERM, Ctrl-C) while it waited."""


class Backoff:
    """Delays that grow from ``minimum`` by ``factor`` up to ``maximum``, with +-20% jitter."""

    def __init__(self, minimum: float, maximum: float, factor: float = 1.6, rng: random.Random | None = None) -> None:
        if not 0 < minimum <= maximum:
            raise ValueError(f"need 0 < minimum <= maximum, got {minimum}, {maximum}")
        self.minimum, self.maximum, self.factor = minimum, maximum, factor
        self._next = minimum
        self._rng = rng or random.Random()

    def reset(self) -> None:
        self._next = self.minimum

    def next(self) -> float:
        delay = self._next
        self._next = min(self.maximum, self._next * self.factor)
        return delay * self._rng.uniform(0.8, 1.2)


def wait_for(
    check: Callable[[], T | None],
    stop: threading.Event,
    timeout: float | None,
    backoff: Backoff,
    clock: Callable[[], float] = time.monotonic,
) -> T | None:
    """Call ``check`` until it returns something other than None; None once ``timeout`` passes.

    Raises :class:`Stopped` as soon as ``stop`` is set.
    """
    deadline = None if timeout is None else clock() + timeout
    backoff.reset()
    while True:
        if stop.is_set():
            raise Stopped()
        try:
            value = check()
        except StorageUnavailableError as exc:  # the store is down for now: the bounded wait goes on
            logger.warning("storage unavailable while waiting (%s); will try again", exc)
            value = None
        if value is not None:
            return value
        delay = backoff.next()
        if deadline is not None:
            remaining = deadline - clock()
            if remaining <= 0:
                return None
            delay = min(delay, remaining)
        if stop.wait(delay):
            raise Stopped()
