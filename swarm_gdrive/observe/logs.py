"""The nodes' JSONL logs (``logs/{node}/metrics.jsonl``, ``training_events.jsonl``) into the monitor's event and
metric tables, with memory linear in the logs whatever they hold.

Lines are decoded one at a time and only what the tables keep is held: per metric key, the row numbers and
values that carry it. The metric table has one column per key, so a log of distinct keys would make it
quadratic (rows x keys): a node's log adds at most :data:`MAX_METRIC_KEYS_PER_NODE` keys and the table holds
at most :data:`MAX_METRIC_KEYS` (those logged by the most nodes first); a large table stores its rarely
filled columns sparse. What is dropped, and every line rejected, is said in the snapshot's problems.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from swarm_gdrive.names import validate_name
from swarm_gdrive.protocol.exchange import A_FOLDER, NOT_A_FOLDER, Exchange, os_reason
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import EventRecord, MetricRecord, iter_lines
from swarm_gdrive.storage import FileInfo
from swarm_gdrive.storage.base import StorageUnavailableError

#: Read cap for one JSONL log file.
MAX_LOG_BYTES = 64 * 1024 * 1024
LOG_FILES = ("metrics.jsonl", "training_events.jsonl")
EVENT_COLUMNS = ["node", "ts", "round", "event", "level", "message"]
METRIC_COLUMNS = ["node", "ts", "round"]
#: One row per external group an asynchronous worker took (its ``externals_taken`` events, GDRIVE_IMPLEMENTATION.md
#: §5.10): the taker, its own round and the event's time, then the group's source, source round, age on the taker's
#: clock and staleness in the taker's own rounds.
EXTERNAL_COLUMNS = ["node", "ts", "round", "source", "source_round", "age_s", "staleness_rounds"]
#: The ``externals_taken`` data lists those rows are read from, and the type each entry must have.
_EXTERNAL_FIELDS = {"sources": str, "source_rounds": int, "age_s": (int, float), "staleness_rounds": int}
#: Distinct metric keys one node's log may bring into the table (a worker logs under a hundred).
MAX_METRIC_KEYS_PER_NODE = 256
#: Distinct metric keys in the table, those logged by the most nodes kept first.
MAX_METRIC_KEYS = 1024
#: Reasons kept per log file among the problems; one more line counts the rest.
MAX_PROBLEMS_PER_FILE = 20
#: Above this many cells (rows x keys) the table stores a column filled in fewer than 1/8 of the rows sparse.
DENSE_CELLS = 4_000_000
SPARSE_FILL = 1 / 8


def printable(text: str) -> str:
    """``text`` without control characters (a line break, a terminal escape): safe to print or put in HTML."""
    return text if text.isprintable() else "".join(c if c.isprintable() else " " for c in text)


@dataclass
class _Column:
    rows: array = field(default_factory=lambda: array("q"))
    values: array = field(default_factory=lambda: array("d"))
    ints: bool = True  # every value an int: the column is int64 when it is also full


class MetricTable:
    """Metric lines, one row each, added node by node; :meth:`frame` builds the DataFrame."""

    def __init__(self) -> None:
        self.nodes: list[str] = []
        self.ts = array("d")
        self.rounds = array("d")
        self.round_missing = False
        self.columns: dict[str, _Column] = {}
        self.key_nodes: dict[str, int] = {}  # key -> how many nodes log it

    def add(self, node: str, records, dropped: Callable[[int], None]) -> None:
        """Add ``node``'s records; ``dropped(n)`` is told how many values of keys beyond its cap were left out."""
        own: set[str] = set()
        over = 0
        for record in records:
            row = len(self.ts)
            self.nodes.append(node)
            self.ts.append(record.ts)
            self.round_missing |= record.round is None
            self.rounds.append(np.nan if record.round is None else record.round)
            for key, value in record.values.items():
                if key not in own:
                    if len(own) >= MAX_METRIC_KEYS_PER_NODE:
                        over += 1  # counted, not kept: a set of the dropped keys would grow as the table did
                        continue
                    own.add(key)
                    self.key_nodes[key] = self.key_nodes.get(key, 0) + 1
                column = self.columns.setdefault(key, _Column())
                column.rows.append(row)
                column.values.append(np.nan if value is None else value)
                column.ints &= type(value) is int
        if over:
            dropped(over)

    def frame(self) -> tuple[pd.DataFrame, int]:
        """The table sorted by ``ts``, and how many keys beyond :data:`MAX_METRIC_KEYS` were left out."""
        n = len(self.ts)
        order = np.argsort(np.frombuffer(self.ts, dtype=float), kind="stable")
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n)
        kept = sorted(self.columns, key=lambda k: -self.key_nodes[k])[:MAX_METRIC_KEYS]  # stable: first seen first
        rounds = np.frombuffer(self.rounds, dtype=float)[order]
        data: dict[str, object] = {
            "node": np.asarray(self.nodes, dtype=object)[order],
            "ts": np.frombuffer(self.ts, dtype=float)[order],
            "round": rounds if self.round_missing else rounds.astype(np.int64),
        }
        sparse = n * len(kept) > DENSE_CELLS
        for key in kept:
            column = self.columns[key]
            values = np.full(n, np.nan)
            values[rank[np.frombuffer(column.rows, dtype=np.int64)]] = np.frombuffer(column.values, dtype=float)
            if len(column.rows) == n and column.ints:
                data[key] = values.astype(np.int64)
            elif sparse and len(column.rows) < SPARSE_FILL * n:
                data[key] = pd.arrays.SparseArray(values)
            else:
                data[key] = values
            del self.columns[key]  # its arrays are in the frame now
        return pd.DataFrame(data), len(self.columns)


@dataclass
class Logs:
    """What :func:`load_logs` read: the event and metric tables, the external groups taken (asynchronous mode) and
    each node's log files."""

    events: pd.DataFrame
    metrics: pd.DataFrame
    externals: pd.DataFrame
    present: dict[str, set[str]]


def external_rows(node: str, rec: EventRecord) -> list[dict] | None:
    """The rows of :data:`EXTERNAL_COLUMNS` of one ``externals_taken`` event; None when its data is not the parallel
    lists the worker writes (a list missing, of another length, or an entry of the wrong type)."""
    lists = [rec.data.get(name) for name in _EXTERNAL_FIELDS]
    if not all(isinstance(v, list) for v in lists) or len({len(v) for v in lists}) != 1:
        return None
    for values, kind in zip(lists, _EXTERNAL_FIELDS.values(), strict=True):
        if not all(isinstance(v, kind) and not isinstance(v, bool) for v in values):
            return None
    return [
        {
            "node": node,
            "ts": rec.ts,
            "round": rec.round,
            "source": printable(source),
            "source_round": source_round,
            "age_s": float(age),
            "staleness_rounds": stale,
        }
        for source, source_round, age, stale in zip(*lists, strict=True)
    ]


def load_logs(
    exchange: Exchange,
    problems: list[str],
    pick: Callable[[str, dict[str, FileInfo]], dict[str, FileInfo]] | None = None,
) -> Logs:
    """The event and metric tables, the external groups taken and each node's log files, from every
    ``logs/{node}/`` folder (``pick``: which of them, by node, a reader with bounds reads; None: all); what cannot be
    read is appended to ``problems``."""
    layout = exchange.layout
    events: dict[str, list] = {c: [] for c in EVENT_COLUMNS}
    externals: list[dict] = []
    table = MetricTable()
    present_by_node: dict[str, set[str]] = {}
    logs = f"{layout.root}/logs"
    folders: dict[str, FileInfo] = {}
    for info in exchange.entries(logs):
        try:
            node = validate_name(info.name)
        except ValueError:
            continue
        if not info.is_dir:
            problems.append(f"{logs}/{info.name}: {NOT_A_FOLDER}")
            continue
        folders[node] = info
    for node in folders if pick is None else pick(logs, folders):
        present = _present(exchange, layout, node, problems)
        present_by_node[node] = present
        for rec in _records(exchange, layout.events_file(node), EventRecord, present, problems):
            for column, value in zip(
                EVENT_COLUMNS,
                (node, rec.ts, rec.round, printable(rec.event), rec.level, printable(rec.message)),
                strict=True,
            ):
                events[column].append(value)
            if rec.event == "externals_taken":
                rows = external_rows(node, rec)
                if rows is None:
                    problems.append(
                        f"{layout.events_file(node)}: an externals_taken event at {rec.ts} without its lists"
                    )
                externals += rows or []
        path = layout.metrics_file(node)
        records = _records(exchange, path, MetricRecord, present, problems)
        table.add(node, records, lambda n, path=path: problems.append(_over_node_cap(path, n)))
    events_df = pd.DataFrame(events, columns=EVENT_COLUMNS)
    events_df = events_df.sort_values("ts", kind="stable").reset_index(drop=True) if len(events_df) else events_df
    externals_df = pd.DataFrame(externals, columns=EXTERNAL_COLUMNS)
    if not len(table.ts):
        return Logs(events_df, pd.DataFrame(columns=METRIC_COLUMNS), externals_df, present_by_node)
    metrics, over = table.frame()
    if over:
        problems.append(
            f"{logs}: {over} metric key(s) left out of the table, which holds at most {MAX_METRIC_KEYS} "
            "(those logged by the most nodes)"
        )
    return Logs(events_df, metrics, externals_df, present_by_node)


def _over_node_cap(path: str, count: int) -> str:
    return (
        f"{path}: {count} metric value(s) left out: their keys are beyond the first {MAX_METRIC_KEYS_PER_NODE} "
        "distinct keys a node may log"
    )


def _present(exchange: Exchange, layout: Layout, node: str, problems: list[str]) -> set[str]:
    """The log files of ``logs/{node}/``; one that is a folder is a problem."""
    present = set()
    for f in exchange.entries(layout.logs_dir(node)):
        if f.name not in LOG_FILES:
            continue
        if f.is_dir:
            problems.append(f"{layout.logs_dir(node)}/{f.name}: {A_FOLDER}")
        else:
            present.add(f.name)
    return present


def _records(exchange: Exchange, path: str, model, present: set[str], problems: list[str]):
    """The valid lines of one log written by its folder's node, one at a time; the others are problems."""
    if path.rsplit("/", 1)[-1] not in present:
        return
    try:
        data = exchange.storage.read_bytes(path, MAX_LOG_BYTES)
    except StorageUnavailableError:
        raise
    except FileNotFoundError:
        return
    except OSError as exc:  # too large, not a regular file, refused
        problems.append(f"{path}: {os_reason(exc)}")
        return
    node = path.rsplit("/", 2)[-2]
    bad = 0
    for _, record, problem in iter_lines(data, model):
        if record is None:
            bad += 1
            if bad <= MAX_PROBLEMS_PER_FILE:
                problems.append(f"{path}: {problem}")
        elif record.node_id == node:  # a line naming another node is that node's claim: not trusted
            yield record
    if bad > MAX_PROBLEMS_PER_FILE:
        problems.append(f"{path}: {bad - MAX_PROBLEMS_PER_FILE} more line(s) rejected")
