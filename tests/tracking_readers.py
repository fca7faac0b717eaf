"""Read back what the trackers wrote, with each tracker's own formats (tests of REPORT_TO).

- TensorBoard: tensorboard's ``EventAccumulator``.
- W&B offline runs: the ``.wandb`` file is a LevelDB-style log (a 7-byte header ``:W&B``, 0xBEE1, version 0;
  32 KiB blocks of records, each a 7-byte header of crc32, length, type FULL/FIRST/MIDDLE/LAST) of
  ``wandb.proto.wandb_internal_pb2.Record`` messages; wandb 0.31 ships no Python reader of it, so the framing is
  read here and every record is parsed by wandb's own protobuf classes. Assumed from the file itself and the
  LevelDB log format; a framing error fails the test rather than passing it.
- trackio: its SQLite database, ``metrics`` rows of (run_name, step, metrics JSON).
"""

from __future__ import annotations

import json
import sqlite3
import struct
from pathlib import Path
from typing import Any

_BLOCK = 32768
_HEADER = struct.Struct("<IHB")


def tensorboard_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] of every event file under ``folder``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def wandb_records(path: Path) -> list[Any]:
    """The records of one offline run file, parsed by wandb's protobuf classes."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    pos, pending, out = 7, b"", []
    while pos < len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER.size:
            pos += left
            continue
        _crc, length, kind = _HEADER.unpack_from(data, pos)
        pos += _HEADER.size
        chunk, pos = data[pos : pos + length], pos + length
        if kind == 0 and length == 0:  # zero padding at a block's end
            pos += _BLOCK - pos % _BLOCK if pos % _BLOCK else 0
            continue
        assert kind in (1, 2, 3, 4), kind
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def wandb_run(folder: Path) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """(the run's project, group, name and job type; its history rows) of the one offline run under ``folder``."""
    (path,) = folder.rglob("run-*.wandb")
    run: dict[str, str] = {}
    history = []
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run = {"project": r.project, "group": r.run_group, "name": r.display_name, "job_type": r.job_type}
        elif kind == "history":
            history.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item})
    return run, history


def trackio_rows(folder: Path, project: str) -> list[tuple[str, int, dict[str, float]]]:
    """(run name, step, metrics) of every row of ``project``'s trackio database under ``folder``."""
    with sqlite3.connect(folder / f"{project}.db") as db:
        rows = db.execute("SELECT run_name, step, metrics FROM metrics ORDER BY id").fetchall()
    return [(name, step, json.loads(metrics)) for name, step, metrics in rows]
