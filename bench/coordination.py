"""Coordination cost of the protocol: round overhead and storage calls per node per round, against N and J.

A real coordinator and N real workers (``swarm_gdrive.protocol.coordinator`` / ``worker``, the synthetic
workload: the full protocol, no model) run as threads of this process, against a local folder or
the Drive emulator (``tests/drive_emulator.py``) with a per-request latency. Every node gets its
own backend instance, wrapped in :class:`CountingStorage`, which records each storage call (when
it ended, what it touched, bytes, and on Drive the API requests it cost).

Measured per round transition R -> R+1:

- overhead: from the last worker's reward submission for R (its write returned) to the moment
  every worker is working on R+1 (its workload's ``generate`` for R+1 was called);
- of which coordinator: last submission -> the coordinator's state write for R+1 returned;
- of which pickup: that state write -> the last worker started R+1.

Storage calls, bytes and Drive API requests are counted per worker between the starts of two
consecutive rounds (so the wait for the next round is in it), and for the coordinator between
two state advances. Round 0 (joining) and the last round (finishing) are left out when there
are other rounds. Nodes are threads of one process: they share one interpreter lock, so CPU
work of many nodes (JSON parsing, validation) is serialised; see bench/README.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.common import finite, machine_info, machine_line, machine_tag, markdown_table, source_version, write_result
from swarm_gdrive.config import Config, from_env
from swarm_gdrive.protocol.coordinator import Coordinator
from swarm_gdrive.protocol.identity import claim_identity
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.worker import Worker
from swarm_gdrive.protocol.workload import StageContext, SyntheticWorkload
from swarm_gdrive.storage import DEFAULT_MAX_READ_BYTES, FileInfo, LocalStorage, Storage
from swarm_gdrive.storage.base import make_dirs, prefetch_folders

TESTS_DIR = Path(__file__).resolve().parent.parent / "tests"


# -- counting ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One storage call of one node."""

    ended: float  # time.time() when it returned
    op: str
    path: str
    nbytes: int
    api_calls: int  # Drive requests it cost (0 on a backend without counters)
    state_round: int | None = None  # for a write of the state file: the round it announced


class CountingStorage:
    """A :class:`~swarm_gdrive.storage.Storage` that records every call it passes to ``inner``."""

    def __init__(self, inner: Storage, layout: Layout) -> None:
        self.inner = inner
        self.layout = layout
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self.counters = getattr(inner, "counters", None)  # the worker reads a backend's counters into metrics

    def _api(self) -> int:
        """Drive requests of the calling thread so far (a call's cost is the difference; other threads' requests
        are theirs)."""
        per_thread = getattr(self.inner, "thread_api_calls", None)
        return per_thread() if per_thread is not None else 0

    def _run(self, op: str, path: str, fn: Callable[[], Any], nbytes: int = 0, state_round: int | None = None) -> Any:
        before = self._api()
        result, size = None, nbytes
        try:
            result = fn()
            if isinstance(result, bytes):
                size = len(result)
            return result
        finally:
            call = Call(time.time(), op, path, size, self._api() - before, state_round)
            with self._lock:
                self.calls.append(call)

    def read_bytes(self, path: str, max_bytes: int = DEFAULT_MAX_READ_BYTES) -> bytes:
        return self._run("read", path, lambda: self.inner.read_bytes(path, max_bytes))

    def write_bytes(self, path: str, data: bytes) -> None:
        announced = json.loads(data)["round"] if path == self.layout.state_file else None
        self._run("write", path, lambda: self.inner.write_bytes(path, data), len(data), announced)

    def append_bytes(self, path: str, data: bytes) -> None:
        self._run("append", path, lambda: self.inner.append_bytes(path, data), len(data))

    def list(self, folder: str, include_hidden: bool = False) -> list[FileInfo]:
        return self._run("list", folder, lambda: self.inner.list(folder, include_hidden))

    def delete(self, path: str) -> None:
        self._run("delete", path, lambda: self.inner.delete(path))

    def remove_empty_dir(self, folder: str) -> bool:
        return self._run("rmdir", folder, lambda: self.inner.remove_empty_dir(folder))

    def make_dirs(self, folder: str) -> None:
        self._run("mkdir", folder, lambda: make_dirs(self.inner, folder))

    def prefetch_folders(self, folders: list[str]) -> None:
        self._run("prefetch", folders[0] if folders else "", lambda: prefetch_folders(self.inner, folders))

    def move(self, src: str, dst: str) -> None:
        self._run("move", src, lambda: self.inner.move(src, dst))

    def describe(self) -> str:
        return f"counted {self.inner.describe()}"


def category(layout: Layout, path: str) -> str:
    """Which protocol file a path belongs to: state, peers, rewards, rollouts, logs, experiment, other."""
    rest = path[len(layout.root) + 1 :] if path.startswith(layout.root + "/") else path
    head = rest.split("/", 1)[0]
    if head == "experiment.json":
        return "experiment"
    return head if head in ("state", "peers", "rewards", "rollouts", "logs") else "other"


class RecordingWorkload:
    """The synthetic workload, noting when this worker starts working on each round (stage 0's generate)."""

    def __init__(self, inner: SyntheticWorkload) -> None:
        self.inner = inner
        self.round_started: dict[int, float] = {}

    def generate(self, ctx: StageContext) -> Iterator:
        if ctx.stage == 0:
            self.round_started.setdefault(ctx.round, time.time())
        return self.inner.generate(ctx)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


# -- running a swarm ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSpec:
    """One swarm run."""

    backend: str  # local | drive
    workers: int
    transplant: int  # J
    rounds: int = 4
    samples: int = 4  # I
    generations: int = 4  # G
    step_seconds: float = 0.5
    poll: str = "default"  # "default" (the package's POLL_INTERVAL_MIN/MAX) or "MIN:MAX" seconds
    latency_s: float = 0.0  # Drive emulator: delay of every request
    measure_from: int = 1  # the first round measured (0 joins; later, a steady state where no folder is young)
    completion_chars: int = 0  # each completion padded to about this length (0: the bare answer)

    @property
    def name(self) -> str:
        latency = f"-lat{self.latency_s:g}" if self.backend == "drive" else ""
        tail = f"-from{self.measure_from}" if self.measure_from != 1 else ""
        tail += f"-c{self.completion_chars}" if self.completion_chars else ""
        return f"{self.backend}{latency}-n{self.workers}-j{self.transplant}-poll{self.poll.replace(':', '_')}{tail}"


class NodeThread(threading.Thread):
    """One node (coordinator or worker) of the swarm in a thread, on its own counted backend."""

    def __init__(self, config: Config, storage: CountingStorage, completion_chars: int = 0) -> None:
        super().__init__(daemon=True, name=config.node_id)
        self.config = config
        self.storage = storage
        self.completion_chars = completion_chars
        self.stop = threading.Event()
        self.code: int | None = None
        self.error: str | None = None
        self.workload: RecordingWorkload | None = None

    def run(self) -> None:
        try:
            if self.config.is_coordinator:
                self.code = Coordinator(self.config, self.storage, self.config.node_id, self.stop).run()
                return
            identity = claim_identity(self.config.local_dir, self.config.experiment_name, "worker", self.config.node_id)
            c = self.config
            self.workload = RecordingWorkload(
                SyntheticWorkload(
                    c.num_train_samples, c.num_generations, c.synthetic_step_seconds, self.stop, self.completion_chars
                )
            )
            try:
                self.code = Worker(self.config, self.storage, identity, self.workload, self.stop).run()
            finally:
                identity.release()
        except Exception as exc:  # recorded in the result: a benchmark run that failed says how
            self.error = f"{type(exc).__name__}: {exc}"


class EmulatorProcess:
    """The Drive emulator in a process of its own (``--emulator-process``): its request handling then does not
    share this process's interpreter lock with the nodes, as Drive's servers do not. The same interface as the
    parts of ``DriveEmulator`` the benchmark uses: ``root_id``, ``service()``, ``call_latency_s`` (set) and
    ``request_count()``; commands go over the child's stdin, one line each, answered on its stdout."""

    CHILD = (
        "import json, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from drive_emulator import DriveEmulator\n"
        "emu = DriveEmulator().start()\n"
        "import time\n"
        "print(json.dumps({'root_id': emu.root_id, 'doc': emu.discovery_document()}), flush=True)\n"
        "for line in sys.stdin:\n"
        "    cmd, _, arg = line.strip().partition(' ')\n"
        "    if cmd == 'latency':\n"
        "        emu.call_latency_s = float(arg)\n"
        "    if cmd == 'quit':\n"
        "        break\n"
        "    print(len(emu.requests), time.process_time(), flush=True)\n"
        "emu.stop()\n"
    )

    def __init__(self) -> None:
        import subprocess

        self._proc = subprocess.Popen(
            [sys.executable, "-c", self.CHILD, str(TESTS_DIR)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self._proc.stdout is not None and self._proc.stdin is not None
        hello = json.loads(self._proc.stdout.readline())
        self.root_id, self._doc = hello["root_id"], hello["doc"]

    def _ask(self, line: str) -> tuple[int, float]:
        """(requests served, CPU seconds used) after the command."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(line + "\n")
        self._proc.stdin.flush()
        count, cpu = self._proc.stdout.readline().split()
        return int(count), float(cpu)

    @property
    def call_latency_s(self) -> float:
        raise AttributeError("write-only")

    @call_latency_s.setter
    def call_latency_s(self, value: float) -> None:
        self._ask(f"latency {value}")

    def request_count(self) -> int:
        return self._ask("count")[0]

    def cpu_s(self) -> float:
        """CPU seconds the emulator's process has used."""
        return self._ask("count")[1]

    def service(self) -> Any:
        """A Drive client on the child's server, as ``DriveEmulator.service`` makes one."""
        if str(TESTS_DIR) not in sys.path:
            sys.path.insert(0, str(TESTS_DIR))
        from drive_emulator import client_for

        return client_for(self._doc)

    def stop(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.write("quit\n")
            self._proc.stdin.close()
            self._proc.wait(30)


def request_count(emulator: Any) -> int:
    """Requests an emulator has served so far, in this process or another."""
    counter = getattr(emulator, "request_count", None)
    return counter() if counter is not None else len(emulator.requests)


def swarm_env(spec: RunSpec, gdrive_path: str, local_dir: Path, experiment: str) -> dict[str, str]:
    """Environment of every node; heartbeat and liveness stay at the package's defaults."""
    env = {
        "GDRIVE_PATH": gdrive_path,
        "EXPERIMENT_NAME": experiment,
        "SWARM_LOCAL_DIR": str(local_dir),
        "WORKLOAD": "synthetic",
        "MAX_ROUNDS": str(spec.rounds),
        "MIN_WORKERS": str(spec.workers),  # round 0 opens once every worker is live: they start together
        "NUM_TRANSPLANT_TREES": str(spec.transplant),
        "NUM_TRAIN_SAMPLES": str(spec.samples),
        "NUM_GENERATIONS": str(spec.generations),
        "SYNTHETIC_STEP_SECONDS": str(spec.step_seconds),
        # Rounds must close because every worker submitted, never on a timer: long limits.
        "COORDINATOR_ROUND_INTERVAL": "3600",
        "ROLLOUT_WAIT_TIMEOUT": "3600",
    }
    if spec.poll != "default":
        low, high = spec.poll.split(":")
        env.update({"POLL_INTERVAL_MIN": low, "POLL_INTERVAL_MAX": high})
    return env


def _backend_factory(spec: RunSpec, folder: Path, emulator: Any) -> tuple[str, Callable[[], Storage]]:
    if spec.backend == "local":
        shared = folder / "shared"
        shared.mkdir()
        return str(shared), lambda: LocalStorage(shared)
    from swarm_gdrive.storage.drive import DriveStorage

    prefix = f"bench/{folder.name}"
    return f"gdrive://{emulator.root_id}/{prefix}", lambda: DriveStorage(
        emulator.root_id, prefix, service=emulator.service()
    )


def run_swarm(spec: RunSpec, folder: Path, emulator: Any = None, timeout_s: float = 600) -> dict[str, Any]:
    """Run one swarm to its last round and measure it; the figures as a dict."""
    experiment = "bench"
    layout = Layout(experiment)
    gdrive_path, make_storage = _backend_factory(spec, folder, emulator)
    env = swarm_env(spec, gdrive_path, folder / "local", experiment)
    roles = [("coordinator", "coord")] + [("worker", f"w{i}") for i in range(1, spec.workers + 1)]
    nodes = [
        NodeThread(
            from_env({**env, "NODE_ROLE": role, "NODE_ID": node}),
            CountingStorage(make_storage(), layout),
            spec.completion_chars,
        )
        for role, node in roles
    ]
    requests_before = request_count(emulator) if emulator is not None else 0
    emulator_cpu = getattr(emulator, "cpu_s", None)
    emulator_cpu_before = emulator_cpu() if emulator_cpu is not None else 0.0
    cpu_before = time.process_time()
    started = time.monotonic()
    for node in nodes:
        node.start()
    deadline = started + timeout_s
    for node in nodes:
        node.join(max(0.0, deadline - time.monotonic()))
    timed_out = any(node.is_alive() for node in nodes)
    for node in nodes:
        node.stop.set()
    for node in nodes:
        node.join(30)
    wall = time.monotonic() - started
    cpu = time.process_time() - cpu_before
    result = analyse(spec, layout, nodes[0], nodes[1:])
    result.update(
        {
            "wall_s": wall,
            # Every node and the emulator are threads of this process, under one interpreter lock: near 1 (a
            # core's worth), the harness, not the protocol, sets how long a round takes.
            "cpu_s": cpu,
            "cpu_per_wall": cpu / wall if wall > 0 else None,
            "timed_out": timed_out,
            "exit_codes": {n.config.node_id: n.code for n in nodes if n.code != 0},
            "errors": {n.config.node_id: n.error for n in nodes if n.error},
        }
    )
    if emulator is not None:
        result["emulator_requests"] = request_count(emulator) - requests_before
        if emulator_cpu is not None:  # near 1: the emulator, not the protocol, sets the pace
            result["emulator_cpu_per_wall"] = (emulator_cpu() - emulator_cpu_before) / wall if wall > 0 else None
    return result


# -- analysis ----------------------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    return finite(statistics.median(values)) if values else None


def _per_round(calls: list[Call], windows: list[tuple[float, float]], layout: Layout) -> dict[str, Any]:
    """Mean per window of calls, bytes, API requests, and calls by operation and by file kind."""
    if not windows:
        return {}
    inside = [c for c in calls if any(lo <= c.ended < hi for lo, hi in windows)]
    n = len(windows)
    by_op = Counter(c.op for c in inside)
    by_kind = Counter(category(layout, c.path) for c in inside)
    reads_by_kind = Counter(category(layout, c.path) for c in inside if c.op == "read")
    api_by_call: Counter[str] = Counter()
    for c in inside:
        api_by_call[f"{c.op} {category(layout, c.path)}"] += c.api_calls
    return {
        "calls": len(inside) / n,
        "bytes_read": sum(c.nbytes for c in inside if c.op == "read") / n,
        "bytes_written": sum(c.nbytes for c in inside if c.op in ("write", "append")) / n,
        "api_calls": sum(c.api_calls for c in inside) / n,
        "by_op": {k: v / n for k, v in sorted(by_op.items())},
        "by_kind": {k: v / n for k, v in sorted(by_kind.items())},
        "reads_by_kind": {k: v / n for k, v in sorted(reads_by_kind.items())},
        "api_by_call": {k: v / n for k, v in sorted(api_by_call.items()) if v},
    }


def _steady(rounds: list[int], first: int = 1) -> list[int]:
    """The rounds measured: from ``first`` on (round 0 is joining), or the last one when none is that far."""
    measured = [r for r in rounds if r >= first]
    return measured or rounds[-1:]


def _transitions(spec: RunSpec, layout: Layout, coord: NodeThread, workers: list[NodeThread]) -> list[dict]:
    last_stage = 0  # one stage per round in these runs
    state_written: dict[int, float] = {}
    for call in coord.storage.calls:
        if call.op == "write" and call.state_round is not None:
            state_written.setdefault(call.state_round, call.ended)
    out = []
    for r in range(spec.rounds - 1):
        submitted, started = [], []
        for w in workers:
            path = layout.reward_file(r, last_stage, w.config.node_id)
            submitted += [c.ended for c in w.storage.calls if c.op == "write" and c.path == path]
            if w.workload is not None and r + 1 in w.workload.round_started:
                started.append(w.workload.round_started[r + 1])
        if len(submitted) < len(workers) or len(started) < len(workers) or r + 1 not in state_written:
            out.append({"round": r, "complete": False})
            continue
        last_submit, opened, all_working = max(submitted), state_written[r + 1], max(started)
        out.append(
            {
                "round": r,
                "complete": True,
                "overhead_s": all_working - last_submit,
                "coordinator_s": opened - last_submit,
                "pickup_s": all_working - opened,
                "submission_spread_s": last_submit - min(submitted),
            }
        )
    return out


def analyse(spec: RunSpec, layout: Layout, coord: NodeThread, workers: list[NodeThread]) -> dict[str, Any]:
    """Round overheads and per-node storage figures from the counted calls and the recorded round starts."""
    transitions = _transitions(spec, layout, coord, workers)
    done = [t for t in transitions if t["complete"] and t["round"] + 1 >= spec.measure_from]
    worker_windows: dict[str, list[tuple[float, float]]] = {}
    reached = []
    for w in workers:
        starts = w.workload.round_started if w.workload is not None else {}
        reached.append(max(starts, default=-1))
        rounds = _steady([r for r in sorted(starts) if r + 1 in starts], spec.measure_from)
        worker_windows[w.config.node_id] = [(starts[r], starts[r + 1]) for r in rounds]
    per_worker = [_per_round(w.storage.calls, worker_windows[w.config.node_id], layout) for w in workers]
    per_worker = [p for p in per_worker if p]
    opened = sorted(
        {c.state_round: c.ended for c in reversed(coord.storage.calls) if c.state_round is not None}.items()
    )
    coord_rounds = _steady([r for r, _ in opened if r + 1 in dict(opened) and r < spec.rounds], spec.measure_from)
    coord_windows = [(dict(opened)[r], dict(opened)[r + 1]) for r in coord_rounds]

    def mean_of(key: str) -> float | None:
        values = [p[key] for p in per_worker]
        return finite(statistics.fmean(values)) if values else None

    def mean_map(key: str) -> dict[str, float]:
        keys = sorted({k for p in per_worker for k in p[key]})
        return {k: statistics.fmean(p[key].get(k, 0.0) for p in per_worker) for k in keys}

    return {
        "spec": asdict(spec),
        "name": spec.name,
        "all_reached_last_round": bool(workers) and min(reached) == spec.rounds - 1,
        "last_round_reached": {"min": min(reached, default=-1), "max": max(reached, default=-1)},
        "transitions": transitions,
        "overhead_s": {
            "median": _median([t["overhead_s"] for t in done]),
            "max": finite(max((t["overhead_s"] for t in done), default=math.nan)),
            "coordinator_median": _median([t["coordinator_s"] for t in done]),
            "pickup_median": _median([t["pickup_s"] for t in done]),
        },
        "worker_per_round": {
            "windows_per_worker": len(next(iter(worker_windows.values()), [])),
            "calls": mean_of("calls"),
            "calls_max_worker": finite(max((p["calls"] for p in per_worker), default=math.nan)),
            "bytes_read": mean_of("bytes_read"),
            "bytes_written": mean_of("bytes_written"),
            "api_calls": mean_of("api_calls"),
            "by_op": mean_map("by_op") if per_worker else {},
            "by_kind": mean_map("by_kind") if per_worker else {},
            "reads_by_kind": mean_map("reads_by_kind") if per_worker else {},
            "api_by_call": mean_map("api_by_call") if per_worker else {},
        },
        "coordinator_per_round": _per_round(coord.storage.calls, coord_windows, layout),
    }


# -- growth and report -------------------------------------------------------------------------


def loglog_slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of log(y) on log(x): 0 means flat in N, 1 linear in N."""
    pts = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y is not None and y > 0]
    if len(pts) < 2:
        return None
    mx, my = statistics.fmean(p[0] for p in pts), statistics.fmean(p[1] for p in pts)
    var = sum((p[0] - mx) ** 2 for p in pts)
    return finite(sum((p[0] - mx) * (p[1] - my) for p in pts) / var) if var else None


GROWTH_METRICS = {
    "overhead median (s)": lambda r: r["overhead_s"]["median"],
    "worker calls/round": lambda r: r["worker_per_round"]["calls"],
    "worker bytes read/round": lambda r: r["worker_per_round"]["bytes_read"],
    "worker API calls/round": lambda r: r["worker_per_round"]["api_calls"],
    "coordinator calls/round": lambda r: r["coordinator_per_round"].get("calls"),
    "coordinator API calls/round": lambda r: r["coordinator_per_round"].get("api_calls"),
}


def growth(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each (backend, latency, poll, J): the log-log slope of each figure against N."""
    out = []
    key = lambda r: (r["spec"]["backend"], r["spec"]["latency_s"], r["spec"]["poll"], r["spec"]["transplant"])  # noqa: E731
    for (backend, latency, poll, j), group in itertools.groupby(sorted(runs, key=key), key=key):
        group = sorted(group, key=lambda r: r["spec"]["workers"])
        if len(group) < 2:
            continue
        slopes = {
            name: loglog_slope([(r["spec"]["workers"], get(r)) for r in group]) for name, get in GROWTH_METRICS.items()
        }
        out.append(
            {"backend": backend, "latency_s": latency, "poll": poll, "transplant": j,
             "workers": [r["spec"]["workers"] for r in group], "slope_vs_n": slopes}
        )  # fmt: skip
    return out


def render(result: dict[str, Any]) -> str:
    """The Markdown report of a coordination run."""
    runs = result["runs"]
    rows = [
        [
            r["spec"]["backend"] + (f" ({r['spec']['latency_s']:g} s/call)" if r["spec"]["backend"] == "drive" else ""),
            r["spec"]["poll"],
            r["spec"]["transplant"],
            r["spec"]["workers"],
            "yes" if r["all_reached_last_round"] else "NO",
            r["overhead_s"]["median"],
            r["overhead_s"]["max"],
            r["overhead_s"]["coordinator_median"],
            r["overhead_s"]["pickup_median"],
            r["worker_per_round"]["calls"],
            r["worker_per_round"]["bytes_read"],
            r["worker_per_round"]["bytes_written"],
            r["worker_per_round"]["api_calls"] if r["spec"]["backend"] == "drive" else None,
            r["coordinator_per_round"].get("calls"),
            r["coordinator_per_round"].get("api_calls") if r["spec"]["backend"] == "drive" else None,
            r["wall_s"],
            r.get("cpu_per_wall"),
            r.get("emulator_cpu_per_wall"),
        ]
        for r in runs
    ]
    header = [
        "backend", "poll", "J", "N", "all done", "overhead med (s)", "overhead max (s)", "coord (s)", "pickup (s)",
        "worker calls/round", "bytes read/round", "bytes written/round", "worker API calls/round",
        "coord calls/round", "coord API calls/round", "wall (s)", "CPU s per wall s", "emulator CPU s per wall s",
    ]  # fmt: skip
    slopes = [
        [g["backend"], g["poll"], g["transplant"], ",".join(map(str, g["workers"])), *g["slope_vs_n"].values()]
        for g in result["growth"]
    ]
    kinds = [[r["name"], ", ".join(f"{k} {v:.3g}" for k, v in r["worker_per_round"]["by_kind"].items())] for r in runs]
    drive_calls = [
        [
            r["name"],
            ", ".join(f"{k} {v:.3g}" for k, v in r["worker_per_round"].get("api_by_call", {}).items()),
            ", ".join(f"{k} {v:.3g}" for k, v in r["coordinator_per_round"].get("api_by_call", {}).items()),
        ]
        for r in runs
        if r["spec"]["backend"] == "drive"
    ]
    return "\n\n".join(
        [
            "# Coordination benchmark",
            machine_line(result["machine"]),
            result["how"],
            markdown_table(header, rows),
            "Growth with N: least-squares slope of log(figure) on log(N) (0 = independent of N, 1 = linear).",
            markdown_table(["backend", "poll", "J", "N", *GROWTH_METRICS], slopes),
            "Worker storage calls per round by file kind:",
            markdown_table(["run", "calls/round by kind"], kinds),
            *(
                [
                    "Drive requests per round by storage call and file kind (worker mean; coordinator):",
                    markdown_table(["run", "worker", "coordinator"], drive_calls),
                ]
                if drive_calls
                else []
            ),
        ]
    )


HOW = (
    "Nodes: one coordinator and N workers as threads of one Python process (one interpreter lock), each with its "
    "own backend instance; synthetic workload (I={samples}, G={generations}, {step:g} s simulated compute per "
    "round, completions of {chars}), {rounds} rounds, one stage. Overhead: last worker's reward write returned -> "
    "every worker called generate for the next round (median over the round transitions into the rounds measured); "
    "coord: -> coordinator's state write returned; pickup: state write -> last worker started. Calls/bytes: mean "
    "per worker per round over the rounds measured, {measure_from}.. (round 0 is joining), heartbeats and log "
    "flushes included; a Drive request is charged to the storage call of the thread that made it. poll 'default' = "
    "the package's POLL_INTERVAL_MIN/MAX. CPU s per wall s: the process's CPU time over the run's wall time; near 1"
    " the interpreter lock, not the protocol, sets the pace. The Drive emulator: {emulator}."
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench coordination", description=__doc__.splitlines()[0])
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    p.add_argument("--nodes", type=ints, default=[2, 8, 32, 128], help="N on the local backend")
    p.add_argument("--drive-nodes", type=ints, default=[2, 8, 16], help="N on the Drive emulator (empty: skip)")
    p.add_argument("--transplant", type=ints, default=[0, 4], help="values of J")
    p.add_argument("--polls", default="default,0.1:1", help="poll settings for the local runs: default or MIN:MAX")
    p.add_argument("--fast-poll-nodes", type=ints, default=[32], help="N at which the non-default polls also run")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument(
        "--measure-from",
        type=int,
        default=1,
        help="first round measured (default 1: all but joining; later rounds show a steady state, once no folder "
        "above the round folders is young, 120 s after the start on Drive)",
    )
    p.add_argument("--samples", type=int, default=4, help="I")
    p.add_argument("--generations", type=int, default=4, help="G")
    p.add_argument("--step-seconds", type=float, default=0.5, help="simulated compute per round")
    p.add_argument(
        "--completion-chars",
        type=int,
        default=0,
        help="pad each completion to about this many characters (0: the bare answer, as before; a model's "
        "completion of 256 tokens is about 1000): rollout batches as large as real ones, too large to travel in a "
        "Drive listing",
    )
    p.add_argument("--latency", type=float, default=0.15, help="Drive emulator: seconds per request")
    p.add_argument(
        "--emulator-process",
        action="store_true",
        help="run the Drive emulator in a process of its own (default: a thread of this one, as before issue #16)",
    )
    p.add_argument("--timeout", type=float, default=600, help="per run, seconds")
    p.add_argument("--tag", default=None, help="result file tag (default: the machine's)")
    p.add_argument("--out-dir", type=Path, default=None, help="default bench/results")
    return p.parse_args(argv)


def plan(args: argparse.Namespace) -> list[RunSpec]:
    """The runs of one benchmark invocation."""
    common = dict(
        rounds=args.rounds,
        samples=args.samples,
        generations=args.generations,
        step_seconds=args.step_seconds,
        measure_from=args.measure_from,
        completion_chars=args.completion_chars,
    )
    polls = [p for p in args.polls.split(",") if p]
    specs = []
    for j in args.transplant:
        for i, poll in enumerate(polls):
            sizes = args.nodes if i == 0 else [n for n in args.nodes if n in args.fast_poll_nodes]
            specs += [RunSpec("local", n, j, poll=poll, **common) for n in sizes]
        specs += [RunSpec("drive", n, j, poll=polls[0], latency_s=args.latency, **common) for n in args.drive_nodes]
    return specs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    source = source_version()
    logging.basicConfig(level=logging.ERROR)  # 100+ nodes' INFO lines would drown the progress lines
    specs = plan(args)
    emulator = None
    if any(s.backend == "drive" for s in specs):
        if args.emulator_process:
            emulator = EmulatorProcess()
        else:
            sys.path.insert(0, str(TESTS_DIR))
            from drive_emulator import DriveEmulator

            emulator = DriveEmulator().start()
    runs = []
    try:
        for spec in specs:
            if emulator is not None:
                emulator.call_latency_s = spec.latency_s
            with tempfile.TemporaryDirectory(prefix=f"bench-{spec.name}-") as tmp:
                run = run_swarm(spec, Path(tmp), emulator if spec.backend == "drive" else None, args.timeout)
            runs.append(run)
            print(
                f"{spec.name}: done={run['all_reached_last_round']} overhead median {run['overhead_s']['median']} s, "
                f"worker calls/round {run['worker_per_round']['calls']}, wall {run['wall_s']:.1f} s",
                file=sys.stderr,
                flush=True,
            )
    finally:
        if emulator is not None:
            emulator.stop()
    result = {
        "part": "coordination",
        "machine": machine_info("cpu", source),
        "how": HOW.format(
            samples=args.samples,
            generations=args.generations,
            step=args.step_seconds,
            chars=f"about {args.completion_chars} characters" if args.completion_chars else "a bare answer",
            rounds=args.rounds,
            measure_from=args.measure_from,
            emulator="a process of its own (its CPU time is not in CPU s per wall s)"
            if args.emulator_process
            else "a thread of the nodes' process, under their interpreter lock",
        ),
        "emulator_process": bool(args.emulator_process),
        "runs": runs,
        "growth": growth(runs),
    }
    path = write_result("coordination", args.tag or machine_tag("cpu"), result, render(result), args.out_dir)
    print(f"wrote {path} and {path.with_suffix('.md')}", file=sys.stderr)
    return 0 if all(r["all_reached_last_round"] for r in runs) else 1
