"""What a worker writes to the shared folder in a real hour with the worker notebook's shipped settings.

For each source tree (this one, and ``--before DIR``: a checkout of older code, for example ``git worktree add
/tmp/before <commit>``, first on PYTHONPATH under the same interpreter), the bench builds the worker's environment
the way that tree's ``notebooks/worker.ipynb`` builds it: its parameters cell as shipped, then its
``notebook.node_env(...)`` cell executed, with only these changed: ``GDRIVE_PATH`` a local folder standing in for
the mounted Drive (``<drive>/MyDrive/rl-swarm``, mount mode: a checkpoint's deletions would go to Drive's trash,
so every byte written counts against the quota for 30 days), ``NODE_ID``, ``DEVICE=cpu``, ``MAX_ROUNDS`` large
enough for the hour, and ``EXTRA_ENV`` with ``SYNC_LAG=0`` (a local folder has no lag). A coordinator runs beside
it with the same experiment. Both trees run at the same time (the same load), for ``--minutes`` of wall time; then
the worker gets SIGTERM, as the notebook's stop button would, and what its stop wrote is counted apart.

Bytes written are counted on the worker's files (:class:`WriteCounter`, a scan every 0.5 s): checkpoints apart from
the rest (rollouts, heartbeats, logs, metrics). Result: ``bench/results/drive_budget_<machine>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import machine_info, machine_line, machine_tag, markdown_table, source_version, write_result

ROOT = Path(__file__).resolve().parent.parent


class WriteCounter:
    """Bytes the node ``node`` writes under ``folder`` (its files: a path part that is or starts with its name),
    seen by scanning every 0.5 s, checkpoints apart from the rest. A file (an inode: a rename is not a write) that
    grew since the last scan counts what it grew by (an appended log, a checkpoint being written); one rewritten
    with no more bytes (a heartbeat) counts its whole size again. Deleted files (pruned checkpoints) count as seen,
    and their inodes are forgotten (the file system may give one to the next new file).
    ``timeline``: (seconds since start, checkpoint bytes, other bytes) after each scan that saw a write."""

    def __init__(self, folder: Path, node: str) -> None:
        self.folder, self.node = folder, node
        self.versions: dict[tuple[int, int], tuple[int, int]] = {}  # (device, inode) -> (size, mtime)
        self.checkpoint_folders: set[str] = set()
        self.checkpoint_bytes = 0
        self.other_bytes = 0
        self.largest_checkpoint = 0
        self.started = time.monotonic()
        self.timeline: list[tuple[float, int, int]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.scan()

    def _mine(self, path: Path) -> bool:
        return any(part == self.node or part.startswith((self.node + ".", "." + self.node)) for part in path.parts)

    def scan(self) -> None:
        with self._lock:
            self._scan()

    def _scan(self) -> None:
        checkpoints: dict[Path, int] = {}
        before = (self.checkpoint_bytes, self.other_bytes)
        present: set[tuple[int, int]] = set()
        for path in list(self.folder.rglob("*")):
            if not self._mine(path.relative_to(self.folder)):
                continue
            try:
                stat = path.stat()
            except OSError:
                continue
            if not path.is_file():
                continue
            inode = (stat.st_dev, stat.st_ino)
            present.add(inode)
            seen = self.versions.get(inode)
            if seen != (stat.st_size, stat.st_mtime_ns):
                written = stat.st_size - seen[0] if seen and stat.st_size > seen[0] else stat.st_size
                if "checkpoints" in path.parts:
                    self.checkpoint_bytes += written
                else:
                    self.other_bytes += written
                self.versions[inode] = (stat.st_size, stat.st_mtime_ns)
            if "checkpoints" in path.parts:
                self.checkpoint_folders.add(path.parent.name)
                checkpoints[path.parent] = checkpoints.get(path.parent, 0) + stat.st_size
        self.largest_checkpoint = max([self.largest_checkpoint, *checkpoints.values()])
        for gone in set(self.versions) - present:  # a deleted file's inode may be reused by a new file: counted anew
            del self.versions[gone]
        if (self.checkpoint_bytes, self.other_bytes) != before:
            self.timeline.append((time.monotonic() - self.started, self.checkpoint_bytes, self.other_bytes))

    def stop(self) -> None:
        """Stop scanning, after one last scan."""
        self._stop.set()
        self._thread.join(5)
        self.scan()


#: Run with the tree first on PYTHONPATH: prints the worker's environment as that tree's worker.ipynb builds it.
_ENV_SCRIPT = r"""
import json, sys
nb = json.load(open(sys.argv[1]))
cells = ["".join(c["source"]) for c in nb["cells"]]
(parameters,) = [s for c, s in zip(nb["cells"], cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
(launch,) = [s for s in cells if "notebook.node_env(" in s]
scope = {}
exec(parameters, scope)
scope.update(json.loads(sys.argv[2]))
exec(launch, scope)
print(json.dumps({"env": scope["env"], "parameters": {k: v for k, v in scope.items() if k.isupper()}}, default=str))
"""


def notebook_env(source: Path, overrides: dict[str, Any], base_env: dict[str, str]) -> dict[str, Any]:
    """The worker's environment and parameters as ``source``'s worker.ipynb builds them with ``overrides``."""
    out = subprocess.run(
        [sys.executable, "-c", _ENV_SCRIPT, str(source / "notebooks" / "worker.ipynb"), json.dumps(overrides)],
        env=base_env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


class Run:
    """One tree's coordinator and worker, started now."""

    def __init__(self, label: str, source: Path, scratch: Path, minutes: float) -> None:
        self.label, self.source, self.scratch = label, source, scratch
        drive = scratch / "drive"
        folder = drive / "MyDrive" / "rl-swarm"
        folder.mkdir(parents=True)
        base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MODEL_CACHE_DIR")}
        base.update(HOME=str(scratch / "home"), PYTHONPATH=str(source), TMPDIR=str(scratch), PYTHONUNBUFFERED="1")
        overrides = {
            "STORAGE": "mount",
            "GDRIVE_PATH": str(folder),
            "DRIVE_MOUNT": str(drive),
            "NODE_ID": "worker-1",
            "DEVICE": "cpu",
            "MAX_ROUNDS": 100000,
            "EXTRA_ENV": {"SYNC_LAG": "0"},
            "SWARM_LOCAL_DIR": str(scratch / "worker-local"),
        }
        built = notebook_env(source, overrides, base)
        self.parameters = built["parameters"]
        worker_env = {**base, **built["env"]}
        coordinator_env = {
            **worker_env,
            "NODE_ROLE": "coordinator",
            "NODE_ID": "coordinator",
            "MIN_WORKERS": "1",
            "SWARM_LOCAL_DIR": str(scratch / "coordinator-local"),
        }
        self.experiment = folder / "experiments" / str(self.parameters["EXPERIMENT_NAME"])
        self.logs = {name: open(scratch / f"{name}.log", "w") for name in ("coordinator", "worker-1")}  # noqa: SIM115 - closed in finish()
        command = [sys.executable, "-u", "-m", "swarm_gdrive.launcher"]
        self.coordinator = subprocess.Popen(
            command, env=coordinator_env, cwd=scratch, stdout=self.logs["coordinator"], stderr=subprocess.STDOUT
        )
        self.worker = subprocess.Popen(
            command, env=worker_env, cwd=scratch, stdout=self.logs["worker-1"], stderr=subprocess.STDOUT
        )
        self.started = time.monotonic()
        self.deadline = self.started + minutes * 60
        self.counter = WriteCounter(self.experiment, "worker-1")
        self.result: dict[str, Any] = {}

    def snapshot(self) -> None:
        """At the deadline: what the worker wrote until now, before anything is stopped."""
        self.counter.scan()
        self.seconds = time.monotonic() - self.started
        self.window = (self.counter.checkpoint_bytes, self.counter.other_bytes, len(self._rounds()))
        self.saved_in_window = sorted(s for s in self.counter.checkpoint_folders if s.startswith("round_"))

    def finish(self) -> dict[str, Any]:
        """After :meth:`snapshot`: stop the worker as the stop button does, count its stop's writes, end both."""
        self.worker.send_signal(signal.SIGTERM)
        try:
            worker_code = self.worker.wait(timeout=600)
        except subprocess.TimeoutExpired:
            self.worker.kill()
            worker_code = self.worker.wait()
        self.counter.stop()
        self.coordinator.send_signal(signal.SIGTERM)
        try:
            self.coordinator.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.coordinator.kill()
        for log in self.logs.values():
            log.close()
        round_s = [m["values"]["round/seconds"] for m in self._metrics() if "round/seconds" in m["values"]]
        first_hour = [(c, o) for t, c, o in self.counter.timeline if t <= 3600] or [(0, 0)]
        keys = ("MODEL_NAME", "STORAGE", "CHECKPOINT_MINUTES", "LORA_R", "NUM_TRAIN_SAMPLES", "NUM_GENERATIONS")
        return {
            "label": self.label,
            "source": str(self.source),
            "parameters": {k: self.parameters.get(k) for k in keys},
            "seconds": self.seconds,
            "checkpoint_bytes": self.window[0],
            "other_bytes": self.window[1],
            "rounds": self.window[2],
            "first_hour_bytes": sum(first_hour[-1]),
            "checkpoints_in_window": self.saved_in_window,
            "largest_checkpoint": self.counter.largest_checkpoint,
            "stop_checkpoint_bytes": self.counter.checkpoint_bytes - self.window[0],
            "stop_other_bytes": self.counter.other_bytes - self.window[1],
            "worker_exit": worker_code,
            "round_seconds_mean": sum(round_s) / len(round_s) if round_s else None,
            "stop_event": [e["data"] for e in self._events() if e.get("event") == "checkpoint_on_stop"],
            "timeline": self.counter.timeline,
        }

    def _jsonl(self, name: str) -> list[dict[str, Any]]:
        path = self.experiment / "logs" / "worker-1" / name
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def _metrics(self) -> list[dict[str, Any]]:
        return self._jsonl("metrics.jsonl")

    def _events(self) -> list[dict[str, Any]]:
        return self._jsonl("training_events.jsonl")

    def _rounds(self) -> list[int]:
        return [m["round"] for m in self._metrics() if "round/seconds" in m["values"]]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench drive_budget", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="wall time each tree runs (default 60)")
    parser.add_argument("--before", type=Path, help="a checkout of older code, run at the same time")
    parser.add_argument("--tag", default="", help="suffix of the result's file name")
    parser.add_argument("--scratch", type=Path, help="keep the runs' folders here (default: a temporary folder)")
    return parser.parse_args(argv)


def _round_number(name: str) -> int:
    return int(name.rsplit("_", 1)[-1])


def render(result: dict[str, Any]) -> str:
    runs = result["runs"]
    gb = 1e9

    def per_hour(run: dict[str, Any], key: str) -> float:
        return run[key] / run["seconds"] * 3600 / gb

    rows = [
        ("model", *(r["parameters"]["MODEL_NAME"] for r in runs)),
        ("CHECKPOINT_MINUTES (notebook)", *(r["parameters"]["CHECKPOINT_MINUTES"] for r in runs)),
        ("wall time, s", *(f"{r['seconds']:.0f}" for r in runs)),
        ("rounds trained", *(r["rounds"] for r in runs)),
        ("mean round, s", *(f"{r['round_seconds_mean']:.1f}" if r["round_seconds_mean"] else "-" for r in runs)),
        (
            "checkpoints written (rounds)",
            *(
                f"{len(r['checkpoints_in_window'])} "
                f"({', '.join(sorted(r['checkpoints_in_window'], key=_round_number))})"
                for r in runs
            ),
        ),
        ("a checkpoint, GB", *(f"{r['largest_checkpoint'] / gb:.3f}" for r in runs)),
        ("checkpoint bytes, GB", *(f"{r['checkpoint_bytes'] / gb:.2f}" for r in runs)),
        ("other files, MB", *(f"{r['other_bytes'] / 1e6:.1f}" for r in runs)),
        ("written in the first 60 minutes, GB", *(f"{r['first_hour_bytes'] / gb:.2f}" for r in runs)),
        (
            "**written per hour over the whole run, GB**",
            *(f"**{per_hour(r, 'checkpoint_bytes') + per_hour(r, 'other_bytes'):.2f}**" for r in runs),
        ),
        ("the stop's checkpoint, GB", *(f"{r['stop_checkpoint_bytes'] / gb:.3f}" for r in runs)),
        ("worker's exit code after SIGTERM", *(r["worker_exit"] for r in runs)),
    ]
    return "\n".join(
        [
            "# Drive budget: bytes a worker writes in an hour, worker.ipynb's shipped settings",
            "",
            machine_line(result["machine"]),
            "",
            "Measured, not computed: every byte the worker wrote to the folder standing in for the mounted Drive "
            f"during {result['minutes']:g} minutes of wall time (python -m bench drive_budget; both trees at once, "
            "each a coordinator and a worker on this machine's CPU).",
            "",
            markdown_table(("", *(r["label"] for r in runs)), rows),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    trees = [("this tree", ROOT)] + ([(f"before ({args.before})", args.before.resolve())] if args.before else [])
    scratch_root = Path(args.scratch or tempfile.mkdtemp(prefix="drive-budget-"))
    runs = []
    for index, (label, source) in enumerate(trees):
        scratch = scratch_root / f"tree{index}"
        scratch.mkdir(parents=True, exist_ok=True)
        runs.append(Run(label, source, scratch, args.minutes))
        print(f"drive_budget: {label} started in {scratch}", flush=True)
    end = max(r.deadline for r in runs)
    while time.monotonic() < end:
        time.sleep(max(0.0, min(60.0, end - time.monotonic())))
        for run in runs:
            print(
                f"drive_budget: {run.label}: {time.monotonic() - run.started:.0f} s, "
                f"{run.counter.checkpoint_bytes / 1e9:.2f} GB checkpoints, {run.counter.other_bytes / 1e6:.1f} MB "
                f"other, worker {'running' if run.worker.poll() is None else f'exited {run.worker.returncode}'}",
                flush=True,
            )
        if all(r.worker.poll() is not None for r in runs):
            break
    for run in runs:
        run.snapshot()
    results = [run.finish() for run in runs]
    result = {
        "machine": machine_info("cpu", source_version()),
        "minutes": args.minutes,
        "runs": results,
    }
    tag = machine_tag("cpu") + (f"-{args.tag}" if args.tag else "")
    path = write_result("drive_budget", tag, result, render(result))
    print(render(result))
    print(f"drive_budget: written {path}")
    return 0
