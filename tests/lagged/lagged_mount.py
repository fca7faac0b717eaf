"""A test double for a shared folder reached through a mount that syncs late (Colab's Drive mount, Drive for desktop).

Each node gets its own replica folder and runs the real :class:`~swarm_gdrive.storage.LocalStorage` on it
(``GDRIVE_PATH`` = its replica). A syncer thread in the test process watches every replica and copies each
change a node makes to every other replica after a random delay drawn from the *destination* node's
:class:`Lag` range (its mount's view of the others), so each node sees the others' files late, and files
written in one order appear in another. A delivery mimics a writer's temporary-then-rename as it shows through
a mount: first the new content under the writer's kind of temporary name (``.{name}.{12 hex}.tmp``, which every
reader must ignore), visible for a random while, then the rename onto the final name (seen late). Deletions
reach the others late too. Delays are drawn from ``random.Random(seed)`` in the order changes are seen, every
delay is at most the destination's ``Lag.high``, and the syncer stops by itself after ``max_seconds``.
Everything it does is recorded (:attr:`LaggedMount.deliveries`, :meth:`LaggedMount.summary`) for figures.

What it assumes of Drive's mount and Drive for desktop:

- whole-file propagation: a reader sees either a whole version of a file or the one before; never a part of
  one (the mount downloads a file whole before it shows it), except that a temporary name may be visible;
- last writer wins: per file, a version older than the one a replica already holds never replaces it (a
  reordered, older copy arriving late is dropped); each protocol file has one writer, so no merge is needed;
- a change is picked up whole from the writer's folder within ``scan_interval`` (0.05 s): versions written
  faster than that are coalesced, as a sync client coalesces them;
- the delay of each (change, destination) is independent: a file written after another may appear before it,
  the state may reach one worker a minute before another, and a heartbeat may be seen late;
- changes a node made before its process ended still propagate (its upload had finished); a node that
  ended is *frozen*: nothing reaches its replica any more (:meth:`LaggedMount.freeze`), as a Colab runtime
  that was shut down.

What it does not model: partial or corrupt downloads, duplicate names (Drive's ``(1)`` copies), a mount that
drops a file or serves an older version after a newer one (the nodes' monotonic state rule covers that, §5.5),
conflicting writers of one file, folder removals (only files propagate; an empty folder removed on one replica
stays on the others), per-writer upload delays (the delay is the destination's), listing lag without content
lag, rate limits and FUSE errors (``tests/faults`` covers those), and clock skew (``test_fault_clock.py``).
Appended logs propagate as whole-file copies, possibly with a partial last line (readers skip it).
"""

from __future__ import annotations

import heapq
import json
import os
import random
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from swarm_gdrive.storage.base import is_temporary, temp_name_for

Stat = tuple[int, int, int]  # size, mtime_ns, inode


@dataclass(frozen=True)
class Lag:
    """How late one node sees the others' changes: a delay drawn uniformly from ``[low, high]`` seconds."""

    low: float
    high: float

    def __post_init__(self) -> None:
        if not 0 <= self.low <= self.high:
            raise ValueError(f"Lag needs 0 <= low <= high, got low={self.low}, high={self.high}")


@dataclass
class Delivery:
    """One version of one file (or its deletion) on its way from ``src`` to ``dst``; times in seconds from start."""

    path: str
    src: str
    dst: str
    version: int
    kind: str  # "write" | "delete"
    seen_at: float  # the syncer saw the change in src's replica
    due_at: float  # when the final name (or the deletion) is due at dst
    temp_at: float | None = None  # when the temporary name appeared at dst
    visible_at: float | None = None  # when the final name appeared (or the file went) at dst
    outcome: str = "pending"  # delivered | superseded | frozen | undelivered | failed

    @property
    def delay(self) -> float | None:
        return None if self.visible_at is None else self.visible_at - self.seen_at


@dataclass(order=True)
class _Due:
    at: float
    seq: int
    step: str = field(compare=False)  # "temp" | "final"
    delivery: Delivery = field(compare=False)
    content: bytes = field(compare=False, default=b"")
    temp_name: str = field(compare=False, default="")


class LaggedMount:
    """Replicas of one shared folder, one per node, kept in sync late by a thread (see the module docstring)."""

    def __init__(
        self,
        base: Path,
        lags: Mapping[str, Lag],
        seed: int,
        temp_share: float = 0.5,
        scan_interval: float = 0.05,
        max_seconds: float = 3600.0,
    ) -> None:
        if not 0 <= temp_share <= 1:
            raise ValueError(f"temp_share={temp_share}: use a share of the delay in [0, 1]")
        self.base = Path(base)
        self.lags = dict(lags)
        self.seed = seed
        self.temp_share = temp_share  # a temporary name is visible for up to this share of a delivery's delay
        self.scan_interval = scan_interval
        self.max_seconds = max_seconds
        self.deliveries: list[Delivery] = []
        self.errors: list[str] = []
        self.scans = 0
        self._rng = random.Random(seed)
        self._queue: list[_Due] = []
        self._seq = 0
        self._version = 0
        self._known: dict[str, dict[str, Stat]] = {n: {} for n in self.lags}  # what each replica held at the last look
        self._have: dict[str, dict[str, int]] = {n: {} for n in self.lags}  # newest version applied, per replica
        self._origin: dict[str, str] = {}  # path -> node whose replica it was last written in
        self._frozen: set[str] = set()
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lagged-mount", daemon=True)
        self._t0 = time.monotonic()
        for node in self.lags:
            self.replica(node).mkdir(parents=True, exist_ok=True)

    # -- control -----------------------------------------------------------------------------

    def replica(self, node: str) -> Path:
        """The folder that ``node`` sees as GDRIVE_PATH."""
        return self.base / node

    def now(self) -> float:
        """Seconds since the mount was created (the time base of every record)."""
        return time.monotonic() - self._t0

    def start(self) -> LaggedMount:
        self._thread.start()
        return self

    def freeze(self, node: str) -> None:
        """Stop delivering to ``node``'s replica (its runtime ended); its own last changes still go out."""
        with self._lock:
            self._frozen.add(node)

    def stop(self) -> None:
        """Stop syncing; deliveries still on their way are recorded as ``undelivered``."""
        self._halt.set()
        self._thread.join(timeout=30)
        with self._lock:
            for due in self._queue:
                if due.delivery.outcome == "pending":
                    due.delivery.outcome = "undelivered"
            self._queue.clear()

    def __enter__(self) -> LaggedMount:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the syncer --------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._halt.is_set() and self.now() < self.max_seconds:
            try:
                with self._lock:
                    self._apply_due()
                    for node in self.lags:
                        self._scan(node)
                    self.scans += 1
                    wait = self.scan_interval
                    if self._queue:
                        wait = min(wait, max(0.0, self._queue[0].at - self.now()))
            except Exception as exc:  # noqa: BLE001 - recorded: a syncer failure must fail the test, not hang it
                self.errors.append(f"{type(exc).__name__}: {exc}")
                wait = self.scan_interval
            self._halt.wait(wait)

    def _scan(self, node: str) -> None:
        root = self.replica(node)
        current: dict[str, Stat] = {}
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if not is_temporary(d)]
            for name in files:
                if is_temporary(name):  # a writer's own temporaries, and the syncer's, never propagate
                    continue
                full = os.path.join(folder, name)
                try:
                    st = os.stat(full, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                current[os.path.relpath(full, root)] = (st.st_size, st.st_mtime_ns, st.st_ino)
        known = self._known[node]
        for rel, stat in current.items():
            if known.get(rel) != stat:
                self._changed(node, rel)
        for rel in known.keys() - current.keys():
            if self._origin.get(rel) == node:  # only a file's writer removes it; others lose it through the sync
                self._schedule(node, rel, "delete", b"")
        self._known[node] = current

    def _changed(self, node: str, rel: str) -> None:
        try:
            content = (self.replica(node) / rel).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            return  # replaced or removed since the listing: the next scan sees what became of it
        self._origin[rel] = node
        self._schedule(node, rel, "write", content)

    def _schedule(self, src: str, rel: str, kind: str, content: bytes) -> None:
        self._version += 1
        seen = self.now()
        self._have[src][rel] = self._version
        for dst, lag in self.lags.items():
            if dst == src:
                continue
            delay = self._rng.uniform(lag.low, lag.high)
            delivery = Delivery(rel, src, dst, self._version, kind, seen, seen + delay)
            self.deliveries.append(delivery)
            if kind == "write":
                temp_at = seen + delay - self._rng.uniform(0, self.temp_share * delay)
                temp_name = temp_name_for(Path(rel).name)
                self._push(_Due(temp_at, 0, "temp", delivery, content, temp_name))
                self._push(_Due(seen + delay, 0, "final", delivery, content, temp_name))
            else:
                self._push(_Due(seen + delay, 0, "final", delivery))

    def _push(self, due: _Due) -> None:
        self._seq += 1
        due.seq = self._seq
        heapq.heappush(self._queue, due)

    def _apply_due(self) -> None:
        while self._queue and self._queue[0].at <= self.now():
            due = heapq.heappop(self._queue)
            delivery = due.delivery
            if delivery.outcome != "pending":
                continue
            if delivery.dst in self._frozen:
                delivery.outcome = "frozen"
                self._remove_temp(due)
                continue
            if delivery.version <= self._have[delivery.dst].get(delivery.path, 0):
                delivery.outcome = "superseded"  # a newer version (or the deletion) got there first
                self._remove_temp(due)
                continue
            try:
                self._apply(due)
            except OSError as exc:
                delivery.outcome = "failed"
                self.errors.append(f"{delivery.dst}: {delivery.path}: {exc}")

    def _apply(self, due: _Due) -> None:
        delivery = due.delivery
        target = self.replica(delivery.dst) / delivery.path
        if due.step == "temp":
            target.parent.mkdir(parents=True, exist_ok=True)
            (target.parent / due.temp_name).write_bytes(due.content)
            delivery.temp_at = self.now()
            return
        known = self._known[delivery.dst]
        if delivery.kind == "delete":
            target.unlink(missing_ok=True)
            known.pop(delivery.path, None)
        else:
            temp = target.parent / due.temp_name
            if not temp.exists():  # the temp step came at the same moment, or the folder was removed meanwhile
                target.parent.mkdir(parents=True, exist_ok=True)
                temp.write_bytes(due.content)
            os.replace(temp, target)
            st = os.stat(target)
            known[delivery.path] = (st.st_size, st.st_mtime_ns, st.st_ino)  # the syncer's write, not the node's
        self._have[delivery.dst][delivery.path] = delivery.version
        delivery.visible_at = self.now()
        delivery.outcome = "delivered"

    def _remove_temp(self, due: _Due) -> None:
        if due.step == "final" and due.temp_name:
            (self.replica(due.delivery.dst) / due.delivery.path).parent.joinpath(due.temp_name).unlink(missing_ok=True)

    # -- records -----------------------------------------------------------------------------

    def summary(self) -> dict:
        """What the syncer did: deliveries by outcome, delays per destination, temporaries shown, reorderings."""
        with self._lock:
            deliveries = list(self.deliveries)
        outcomes: dict[str, int] = {}
        for d in deliveries:
            outcomes[d.outcome] = outcomes.get(d.outcome, 0) + 1
        delivered = [d for d in deliveries if d.outcome == "delivered"]
        per_dst = {}
        for node in self.lags:
            delays = sorted(d.delay for d in delivered if d.dst == node and d.delay is not None)
            per_dst[node] = {
                "lag": [self.lags[node].low, self.lags[node].high],
                "delivered": len(delays),
                "delay_p50": _quantile(delays, 0.5),
                "delay_p90": _quantile(delays, 0.9),
                "delay_max": delays[-1] if delays else None,
            }
        return {
            "seed": self.seed,
            "seconds": round(self.now(), 1),
            "scans": self.scans,
            "outcomes": outcomes,
            "temporaries_shown": sum(1 for d in deliveries if d.temp_at is not None),
            "reordered": reordered(deliveries),
            "deletions_delivered": sum(1 for d in delivered if d.kind == "delete"),
            "errors": list(self.errors),
            "per_destination": per_dst,
        }

    def save(self, path: Path) -> None:
        """Every delivery and the summary as JSON (for figures)."""
        with self._lock:
            rows = [asdict(d) for d in self.deliveries]
        path.write_text(json.dumps({"summary": self.summary(), "deliveries": rows}, indent=1))


def reordered(deliveries: list[Delivery]) -> int:
    """Changes from one writer to one reader that became visible before a change the writer made earlier."""
    by_pair: dict[tuple[str, str], list[Delivery]] = {}
    for d in deliveries:
        if d.outcome == "delivered":
            by_pair.setdefault((d.src, d.dst), []).append(d)
    count = 0
    for items in by_pair.values():
        items.sort(key=lambda d: d.seen_at)
        latest = -1.0
        for d in items:
            assert d.visible_at is not None
            if d.visible_at < latest:
                count += 1
            latest = max(latest, d.visible_at)
    return count


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)
