"""Per-node metrics and events as JSONL, buffered so a remote backend is not written per line."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import EventRecord, MetricRecord, encode_line
from swarm_gdrive.storage import Storage

logger = logging.getLogger(__name__)
events_logger = logging.getLogger("swarm_gdrive.events")

_LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class NodeLog:
    """Buffers metric and event lines of one node; :meth:`flush` appends them to the shared folder.

    A flush that fails keeps its lines for the next one, so nothing is lost to a storage hiccup.
    The first append of each file by this process starts with a newline: a process killed mid-append
    leaves a partial last line, and without it the next process's first line would be glued onto
    that fragment and lost with it. Readers skip the blank line (:func:`~swarm_gdrive.protocol.records.decode_lines`).
    """

    def __init__(self, storage: Storage, layout: Layout, node_id: str, max_buffered: int = 500) -> None:
        self._storage = storage
        self._metrics_path = layout.metrics_file(node_id)
        self._events_path = layout.events_file(node_id)
        self._node_id = node_id
        self._metrics: list[bytes] = []
        self._events: list[bytes] = []
        self._lock = threading.Lock()
        self._max_buffered = max_buffered
        self._started: set[str] = set()  # files this process has appended to
        self.round: int | None = None
        #: Called with each metric line's values and round as it is buffered (the node's trackers, REPORT_TO).
        self.sinks: list[Callable[[dict[str, float | int | None], int | None], None]] = []

    def metric(self, values: dict[str, float | int | None], round_: int | None = None) -> None:
        """Buffer one metrics line; keys are namespaced (``train/…``, ``swarm/…``, ``storage/…``).

        A value that is not finite (the gradient norm of an fp16 step that overflowed and was skipped, a NaN
        loss) is written as null, which the record allows; the record refuses inf and NaN, and a metric must
        never stop a node."""
        odd = [k for k, v in values.items() if isinstance(v, float) and not math.isfinite(v)]
        if odd:
            logger.info("metrics not finite, written as null: %s", ", ".join(f"{k}={values[k]}" for k in odd))
            values = {k: (None if k in odd else v) for k, v in values.items()}
        record = MetricRecord(
            node_id=self._node_id,
            round=self.round if round_ is None else round_,
            ts=time.time(),
            values=values,
        )
        self._add(self._metrics, encode_line(record))
        for sink in self.sinks:
            sink(values, record.round)

    def event(self, event: str, message: str = "", level: str = "info", round_: int | None = None, **data: Any) -> None:
        """Buffer one event line, and log it."""
        events_logger.log(_LOG_LEVELS[level], "%s%s%s", event, ": " if message else "", message)
        record = EventRecord(
            node_id=self._node_id,
            round=self.round if round_ is None else round_,
            ts=time.time(),
            event=event,
            level=level,
            message=message[:2048],
            data=data,
        )
        self._add(self._events, encode_line(record))

    def _add(self, buffer: list[bytes], line: bytes) -> None:
        with self._lock:
            buffer.append(line)
            full = len(self._metrics) + len(self._events) >= self._max_buffered
        if full:
            self.flush()

    def flush(self) -> bool:
        """Append what is buffered; True if everything was written."""
        ok = True
        for path, buffer in ((self._metrics_path, self._metrics), (self._events_path, self._events)):
            with self._lock:
                lines, buffer[:] = list(buffer), []
            if not lines:
                continue
            separator = b"" if path in self._started else b"\n"  # ends a fragment a killed process left
            try:
                self._storage.append_bytes(path, separator + b"".join(lines))
                self._started.add(path)
            except OSError as exc:
                logger.error("could not write %s (%s); keeping %d lines for the next flush", path, exc, len(lines))
                self._started.discard(path)  # the failed append may have left a fragment too
                with self._lock:
                    buffer[:0] = lines
                ok = False
        return ok
