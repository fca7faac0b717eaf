"""Bounded waits: poll with exponential backoff and jitter up to a cap, never a fixed sleep."""

from __future__ import annotations

import logging
import math
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

    def reset(self, start: float | None = None) -> None:
        """Start again from ``minimum`` (or from ``start``, a brisker first delay, when given)."""
        self._next = self.minimum if start is None else min(start, self.maximum)

    def next(self) -> float:
        delay = self._next
        self._next = min(self.maximum, self._next * self.factor)
        return delay * self._rng.uniform(0.8, 1.2)


#: A brisk poll is this fraction of POLL_INTERVAL_MIN (0.1 s by default).
BRISK_FRACTION = 0.2
#: Round lengths a :class:`Pacer` remembers; it expects the median of them.
PACE_HISTORY = 3
#: The most brisk polls either side of an expected moment: a long or irregular round widens the window only
#: up to this many brisk delays, so a wait never polls a remote store at the brisk rate for long.
MAX_BRISK_POLLS = 5


class Pacer:
    """A :class:`Backoff` that polls briskly around the moment something is expected, and sleeps before it.

    ``expect(at, window)``: until ``at - window`` the delays are the backoff's, but never past that moment;
    inside ``at +- window`` every delay is ``brisk``; after it the backoff starts again from ``brisk``. Without
    an expected moment it is the plain backoff. The moment comes from :class:`RoundClock`: a round of a swarm
    of equal machines lasts about as long as the last ones did.
    """

    def __init__(self, backoff: Backoff, brisk: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.backoff, self.brisk, self.clock = backoff, brisk, clock
        self.at: float | None = None
        self.window = 0.0
        self._after = False

    def expect(self, at: float | None, window: float = 0.0) -> None:
        """Poll briskly within ``window`` seconds either side of ``at`` (at most :data:`MAX_BRISK_POLLS` brisk
        delays either side); None: no expectation, the plain backoff."""
        self.at, self.window, self._after = at, min(max(window, 0.0), MAX_BRISK_POLLS * self.brisk), False

    def reset(self, start: float | None = None) -> None:
        """Start the backoff again (from ``start`` if given). With nothing expected yet (a node's first rounds), from
        ``brisk``: the delays still grow by the backoff's factor, so a wait of t seconds costs a few more polls
        (log t), and the event is seen within about a third of the time waited instead of up to the minimum
        interval and more."""
        self.backoff.reset(start if start is not None or self.at is not None else self.brisk)

    def next(self) -> float:
        delay = self.backoff.next()
        if self.at is None:
            return delay
        now = self.clock()
        start, end = self.at - self.window, self.at + self.window
        if now < start:
            return min(delay, start - now)
        if now <= end:
            return self.brisk
        if not self._after:  # the moment passed without the event: poll on, from brisk
            self._after = True
            self.backoff.reset(self.brisk)
            return self.brisk
        return delay


class RoundClock:
    """When the next round is expected, from when the last ones were seen to open (one node's own clock).

    A worker also passes each round's ``announced`` opening time (the state's ``round_opened_at``, the coordinator's
    wall clock): spans between those are the rounds' true lengths, free of this worker's own pickup delay (it saw
    each round open some time after it did, and that delay varies), and the expected moment is the last
    announced opening plus the typical length, put on this node's clock by the smallest (seen - announced) of
    the last rounds (the clocks' offset plus the quickest pickup).
    """

    def __init__(self, history: int = PACE_HISTORY) -> None:
        self.history = history
        self._opened: list[tuple[int, float, float | None]] = []

    def opened(self, round_: int, at: float, announced: float | None = None) -> None:
        """Round ``round_`` was first seen open at ``at``; ``announced``: when it opened by the opener's clock."""
        if self._opened and round_ <= self._opened[-1][0]:
            return
        if announced is not None and not math.isfinite(announced):
            announced = None
        self._opened = [*self._opened, (round_, at, announced)][-(self.history + 1) :]

    def _times(self) -> list[tuple[int, float]]:
        """(round, opening) of the remembered rounds: the announced openings where every one has a later one than
        the one before, else this node's sightings."""
        announced = [a for _, _, a in self._opened]
        usable = all(a is not None for a in announced) and all(
            b > a
            for a, b in zip(announced, announced[1:], strict=False)  # type: ignore[operator]
        )
        return [(r, a if usable and a is not None else at) for r, at, a in self._opened]

    @staticmethod
    def _spans(times: list[tuple[int, float]]) -> list[float]:
        pairs = zip(times, times[1:], strict=False)
        return sorted(b[1] - a[1] for a, b in pairs if b[0] == a[0] + 1 and b[1] > a[1])

    def length(self) -> float | None:
        """The median length of the last rounds that followed one another (the lower of the middle two of an even
        number: expecting a round early costs a few brisk polls, expecting it late a backed-off sleep through
        it), or None before two openings were seen."""
        spans = self._spans(self._times())
        return spans[(len(spans) - 1) // 2] if spans else None

    def next_open(self) -> tuple[float, float] | None:
        """(expected moment, window) of the next round's opening, or None while there is nothing to go on. The
        window, either side, is how much the last rounds' lengths varied (their range), between a twentieth and
        a quarter of a round (a tenth while only one length is known); the :class:`Pacer` caps it further."""
        times = self._times()
        spans = self._spans(times)
        if not spans:
            return None
        length = spans[(len(spans) - 1) // 2]
        spread = spans[-1] - spans[0] if len(spans) > 1 else 0.1 * length
        window = min(max(0.05 * length, spread), 0.25 * length)
        # On this node's clock: announced openings are the opener's, shifted by the smallest sighting delay (the
        # clocks' offset plus the quickest pickup; 0 for this node's own sightings).
        shift = min(at - t for (_, at, _), (_, t) in zip(self._opened, times, strict=True))
        return times[-1][1] + shift + length, window


def wait_for(
    check: Callable[[], T | None],
    stop: threading.Event,
    timeout: float | None,
    backoff: Backoff | Pacer,
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
