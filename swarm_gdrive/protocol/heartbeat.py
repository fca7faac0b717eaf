"""A node's registration and heartbeat: its own peers/{node_id}.json, rewritten periodically.

The peer file has one writer, the node named in it; two processes given one NODE_ID would both write it.
Locally the identity lock (``identity.py``) stops the second; across machines the peer file shows it: a
record this process did not write whose heartbeat still rises. :func:`live_twin` looks for one before a
node writes anything, and every beat looks again (GDRIVE_IMPLEMENTATION.md §7).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from swarm_gdrive.protocol.exchange import Exchange
from swarm_gdrive.protocol.records import PeerRecord

logger = logging.getLogger(__name__)

#: Writes of its registration by a process that steps down for an older twin (see _look_for_twin).
FAREWELL_WRITES = 3

#: Called from the heartbeat thread with the message and whether this process is the one that stops.
TwinHook = Callable[[str, bool], None]


class Heartbeat:
    """Writes this node's peer record now and every ``interval`` seconds from a daemon thread.

    Before each write it reads the file back: a record of another registration that appeared after this
    process wrote, or whose heartbeat rose since the last look, is another live process with this NODE_ID.
    Both sides log it as an error; with
    ``on_twin`` the one registered later also stops beating and is told to stop. Changes seen in the
    first ``quiet_s`` seconds (SYNC_LAG) are not counted: a lagging folder may still deliver the writes of
    a predecessor killed just before this process started.
    """

    def __init__(
        self,
        exchange: Exchange,
        role: str,
        run_id: str,
        interval: float,
        quiet_s: float = 0.0,
        on_twin: TwinHook | None = None,
    ) -> None:
        self._exchange = exchange
        self._interval = interval
        self._stop = threading.Event()
        self._lock = threading.Lock()
        now = time.time()
        self._record = PeerRecord(
            node_id=exchange.node_id,
            role=role,
            run_id=run_id,
            registered_at=now,
            heartbeat=0,
            heartbeat_at=now,
            status="alive",
        )
        self._started = time.monotonic()
        self._quiet_s = quiet_s
        self._on_twin = on_twin
        self._others: dict[float, int] = {}  # registered_at of records this process did not write -> top heartbeat
        self._reported: set[float] = set()
        self.stepped_down = False
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> None:
        """Register (first write happens before this returns) and start beating."""
        self.beat()
        self._thread.start()

    def set_round(self, round_: int | None) -> None:
        with self._lock:
            self._record = self._record.model_copy(update={"round": round_})

    def beat(self, status: str = "alive") -> None:
        if status == "alive":
            self._look_for_twin()
        if self.stepped_down:
            return
        self._write(status=status)

    def _write(self, **update: object) -> None:
        """Write the record with the next heartbeat number (and ``update``); a failure is logged, never raised."""
        with self._lock:
            self._record = self._record.model_copy(
                update={"heartbeat": self._record.heartbeat + 1, "heartbeat_at": time.time(), **update}
            )
            record = self._record
        try:
            self._exchange.write_peer(record)
        except OSError as exc:
            logger.warning("heartbeat write failed: %s", exc)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.beat()

    def stop(self, mark_stopped: bool = True) -> None:
        """Stop beating and, unless told not to, mark this node stopped so that nobody waits for it."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self._interval + 5)
        if mark_stopped:
            self.beat(status="stopped")

    def _look_for_twin(self) -> None:
        try:
            seen = self._exchange.read_peer(self._exchange.node_id)
        except OSError:  # storage trouble: the write after it will say so
            return
        if seen is None or seen.registered_at == self._record.registered_at or seen.status != "alive":
            return
        before = self._others.get(seen.registered_at)
        self._others[seen.registered_at] = max(before or 0, seen.heartbeat)
        # Proof of another writer: a registration first seen after this process wrote the file, or one whose
        # heartbeat rose between two looks. What the first look finds is a predecessor's last write (one that was
        # killed never wrote "stopped"); it shows up again only as a stale copy, with no higher heartbeat.
        new = before is None and self._record.heartbeat > 0
        rose = before is not None and seen.heartbeat > before
        if not (new or rose) or seen.registered_at in self._reported:
            return
        if time.monotonic() - self._started < self._quiet_s:
            return
        self._reported.add(seen.registered_at)
        younger = self._record.registered_at > seen.registered_at
        step_down = younger and self._on_twin is not None
        message = (
            f"NODE_ID={self._exchange.node_id!r}: another process is writing "
            f"{self._exchange.layout.peer_file(self._exchange.node_id)} too (registered at {seen.registered_at:.3f}, "
            f"heartbeat {seen.heartbeat}; this one registered at {self._record.registered_at:.3f}): two "
            "processes are running as this node; stop one of them, or give each its own NODE_ID"
            + ("; this one, started later, stops" if step_down else "")
        )
        logger.error("%s", message)
        if step_down:
            # Last writes of this registration, so that the other process sees it at one of its next looks: each of
            # this one's writes may have landed between the other's read and its write, and been overwritten unseen
            # (one last write was, on a loaded CI machine): a few, apart, so that not all of them can.
            for n in range(FAREWELL_WRITES):
                if n:
                    time.sleep(min(self._interval / 2, 1.0))
                self._write()
            self.stepped_down = True
            self._stop.set()
        if self._on_twin is not None:
            self._on_twin(message, step_down)


def live_twin(exchange: Exchange, interval: float, sync_lag: float, stop: threading.Event) -> str | None:
    """Before a node writes anything: what shows another live process with its NODE_ID, or None.

    A peer file of this node (of ``exchange.run_id``'s run) that says ``alive`` is watched for
    2 x ``interval`` + ``sync_lag`` seconds; if its heartbeat rises or another registration replaces it,
    a process is beating as this node. A predecessor killed without writing ``stopped`` leaves a
    frozen file, which costs a restart only that wait.
    """
    node = exchange.node_id
    first = _read_peer(exchange, node)
    if first is None or first.status != "alive":
        return None
    window = 2 * interval + sync_lag
    started = time.monotonic()
    logger.info("peers/%s.json says alive: watching it %.1f s for another process with this NODE_ID", node, window)
    while not stop.wait(min(interval / 2, max(window - (time.monotonic() - started), 0.0))):
        seen = _read_peer(exchange, node)
        elapsed = time.monotonic() - started
        if (
            seen is not None
            and seen.status == "alive"
            and (seen.registered_at != first.registered_at or seen.heartbeat > first.heartbeat)
        ):
            return (
                f"its peer file {exchange.layout.peer_file(node)} went from heartbeat {first.heartbeat} to "
                f"{seen.heartbeat} in {elapsed:.1f} s"
            )
        if elapsed >= window:
            return None
    return None


def _read_peer(exchange: Exchange, node: str) -> PeerRecord | None:
    try:
        return exchange.read_peer(node)
    except OSError as exc:
        logger.warning("could not read this node's peer file: %s", exc)
        return None
