"""The monitor's peak memory on hostile metric lines.

``python metric_memory.py write FOLDER MB`` writes MB of metric lines of 256 fresh keys each into FOLDER (one
worker's log); ``python metric_memory.py load FOLDER`` loads the experiment with the monitor (load, findings,
status table) and prints one JSON line: the peak RSS above the interpreter with the monitor imported
(``grew_mb``), the table's shape and whether a key cap was hit. Each step runs in a fresh process
(tests/faults/test_fault_readers.py), so that the peak is the load's alone.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

from swarm_gdrive.observe import monitor
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.storage import LocalStorage

DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def name(n: int) -> str:
    """A short key: base 36, so that 0.6 MB holds as many distinct keys as it can."""
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = DIGITS[r] + out
        if not n:
            return out


def write(folder: Path, megabytes: float) -> None:
    path = folder / Layout("m").metrics_file("w1")
    path.parent.mkdir(parents=True)
    lines, size, i = [], 0, 0
    while size < megabytes * 2**20:
        values = {name(i * 256 + j): 1 for j in range(256)}
        record = {"schema_version": 1, "kind": "metric", "node_id": "w1", "round": 0, "ts": float(i), "values": values}
        line = json.dumps(record, separators=(",", ":")) + "\n"
        lines.append(line)
        size += len(line)
        i += 1
    path.write_text("".join(lines))


def main() -> None:
    if sys.argv[1] == "write":
        write(Path(sys.argv[2]), float(sys.argv[3]))
        return
    folder = Path(sys.argv[2])
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    snapshot = monitor.load(LocalStorage(folder), "m")
    monitor.findings(snapshot)
    monitor.status_table(snapshot)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    over = any("left out" in p for p in snapshot.problems)
    rows, columns = snapshot.metrics.shape
    print(json.dumps({"grew_mb": (peak - base) / 1024, "rows": rows, "columns": columns, "over_cap": over}))


if __name__ == "__main__":
    main()
