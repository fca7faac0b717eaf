"""A node's registration and heartbeat: its own peers/{node_id}.json, rewritten periodically."""

from __future__ import annotations

import logging
import threading
import time

from swarm_gdrive.protocol.exchange import Exchange
from swarm_gdrive.protocol.records import PeerRecord

logger = logging.getLogger(__name__)


class Heartbeat:
    """Writes this node's peer record now and every ``interval`` seconds from a daemon thread."""

    def __init__(self, exchange: Exchange, role: str, run_id: str, interval: float) -> None:
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
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> None:
        """Register (first write happens before this returns) and start beating."""
        self.beat()
        self._thread.start()

    def set_round(self, round_: int | None) -> None:
        with self._lock:
            self._record = self._record.model_copy(update={"round": round_})

    def beat(self, status: str = "alive") -> None:
        with self._lock:
            self._record = self._record.model_copy(
                update={"heartbeat": self._record.heartbeat + 1, "heartbeat_at": time.time(), "status": status}
            )
            record = self._record
        try:
            self._exchange.write_peer(record)
        except OSError as exc:
            logger.warning("heartbeat write failed: %s", exc)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.beat()

    def stop(self) -> None:
        """Stop beating and mark this node stopped, so that nobody waits for it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._interval + 5)
        self.beat(status="stopped")
