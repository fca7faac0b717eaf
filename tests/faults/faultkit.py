"""Shared machinery of the fault suite: a swarm of real node processes with faults injected, a reader
that watches the folder for partial files while the swarm runs, and the checks every trial makes."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import swarm_gdrive
from swarm_gdrive.config import from_env
from swarm_gdrive.procs import NodeProcess, stop_all
from swarm_gdrive.protocol.layout import Layout, parse_round_dir
from swarm_gdrive.protocol.records import (
    EventRecord,
    ExperimentRecord,
    MetricRecord,
    PeerRecord,
    RecordError,
    RewardRecord,
    RolloutBatch,
    StateRecord,
    decode,
    decode_lines,
)
from swarm_gdrive.protocol.signing import CoordinatorKey, key_path
from swarm_gdrive.storage import LocalStorage
from swarm_gdrive.storage.base import is_temporary

HOOK_DIR = Path(__file__).resolve().parent / "hook"
#: The folder holding the swarm_gdrive these tests imported: nodes must run the same code (a worktree's, under
#: PYTHONPATH), not whichever copy is installed.
PACKAGE_ROOT = Path(swarm_gdrive.__file__).resolve().parent.parent
TESTS_DIR = Path(__file__).resolve().parent.parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

from swarm_threads import fast_env  # noqa: E402

EXPERIMENT = "faults"
LAYOUT = Layout(EXPERIMENT)
KINDS = {"state": StateRecord, "peers": PeerRecord, "rewards": RewardRecord, "rollouts": RolloutBatch}


def swarm_env(folder: Path, **extra: object) -> dict[str, str]:
    """A synthetic swarm of processes: short heartbeats and waits, the fault hook on PYTHONPATH."""
    env = fast_env(
        folder,
        EXPERIMENT,
        MAX_ROUNDS=4,
        NUM_TRANSPLANT_TREES=2,
        MIN_WORKERS=2,
        HEARTBEAT_INTERVAL=0.3,
        LIVENESS_TIMEOUT=8,
        POLL_INTERVAL_MIN=0.05,
        POLL_INTERVAL_MAX=0.4,
        ROLLOUT_WAIT_TIMEOUT=15,
        COORDINATOR_ROUND_INTERVAL=60,
        COORDINATOR_WAIT_TIMEOUT=120,
        SYNTHETIC_STEP_SECONDS=0.3,
        # The hook imports swarm_gdrive while the interpreter starts, before the working directory is on sys.path:
        # without this checkout named here, a node with the hook on would run whichever swarm_gdrive is installed.
        PYTHONPATH=os.pathsep.join([str(HOOK_DIR), str(PACKAGE_ROOT)]),
    )
    return {**env, **{k: str(v) for k, v in extra.items()}}


def faults(**spec: object) -> dict[str, str]:
    """The environment that switches the hook on in one process (see hook/sitecustomize.py)."""
    return {"SWARM_FAULTS": json.dumps(spec)}


def read_record(folder: Path, rel: str, model):
    return decode((folder / rel).read_bytes(), model)


def damaged_lines(data: bytes, model) -> list[bytes]:
    """The complete lines of a JSONL log that do not parse as ``model``."""
    lines = data.split(b"\n")
    return [lines[int(p.split(":", 1)[0].split()[1]) - 1] for p in decode_lines(data, model)[1]]


def check_log(data: bytes, model, torn_ok: bool) -> list[str]:
    """What is wrong with a log: lines glued together (a line lost), or a damaged line where none may be.

    A process SIGKILLed mid-append may leave one partial line (``torn_ok``); the lines after it,
    written by its successor, must be intact.
    """
    bad = damaged_lines(data, model)
    glued = [line for line in bad if line.count(b'"schema_version"') > 1]
    if glued:
        return [f"lines glued together: {glued[0][:200]!r}"]
    if len(bad) > (1 if torn_ok else 0):
        return [f"damaged lines: {[line[:120] for line in bad]}"]
    return []


def _log(folder: Path, node: str, path: str, model, torn_ok: bool) -> list:
    file = folder / path
    if not file.exists():
        return []
    data = file.read_bytes()
    problems = check_log(data, model, torn_ok)
    assert not problems, f"{node}: {path}: {problems}"
    return decode_lines(data, model)[0]


def events(folder: Path, node: str, torn_ok: bool = False) -> list[EventRecord]:
    return _log(folder, node, LAYOUT.events_file(node), EventRecord, torn_ok)


def metrics(folder: Path, node: str, torn_ok: bool = False) -> list[MetricRecord]:
    return _log(folder, node, LAYOUT.metrics_file(node), MetricRecord, torn_ok)


def rejections(folder: Path, node: str, torn_ok: bool = False) -> dict[str, str]:
    """path -> reason of every file_rejected event that ``node`` recorded."""
    return {e.data["path"]: e.message for e in events(folder, node, torn_ok) if e.event == "file_rejected"}


def _tail(proc: NodeProcess, lines: int) -> str:
    return "\n".join([line for line in proc.lines if "resolved configuration" not in line][-lines:])


def wait_until(predicate: Callable[[], object], timeout: float, what: str, nodes: list[NodeProcess]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {n.name} (exit {n.returncode})\n" + _tail(n, 25) for n in nodes)
            raise AssertionError(f"timed out waiting for {what}\n{logs}")
        time.sleep(0.02)


def coordinator_key(swarm: Swarm, node: str = "coord") -> CoordinatorKey:
    """The key the swarm's coordinator signs with (its key file, from its settings): for a test that plants a state
    the signature passes, so that what rejects it is the check under test."""
    return coordinator_key_from_env({**swarm.env, **swarm.extra.get(node, {})}, node)


def coordinator_key_from_env(env: dict[str, str], node: str = "coord") -> CoordinatorKey:
    """The key of coordinator ``node`` started with ``env``: its key file, where its settings put it."""
    config = from_env({**env, "NODE_ROLE": "coordinator", "NODE_ID": node})
    key = CoordinatorKey.load(key_path(config.local_dir, config.experiment_name, config.coordinator_key_file))
    assert key is not None, "the coordinator has no key file yet"
    return key


def plant_state_until_rejected(folder: Path, data: bytes, reason: str, workers: list[NodeProcess], nodes) -> None:
    """Replace the state file with ``data`` again and again until every one of ``workers`` has logged that it
    rejected it for ``reason``. A running coordinator reads its state back every HEARTBEAT_INTERVAL and writes its
    own over anything else (state_restored), at times within milliseconds of the plant, before a worker has
    polled: a single plant then goes unseen (two CI failures). The same bytes give the same reason, which a node
    says once."""
    said = f"rejected {LAYOUT.state_file}: {reason}"
    garbage = folder / "garbage.tmp"

    def seen_or_planted_again() -> bool:
        if all(any(said in line for line in w.lines) for w in workers):
            return True
        garbage.write_bytes(data)
        os.replace(garbage, folder / LAYOUT.state_file)
        time.sleep(0.1)
        return False

    wait_until(seen_or_planted_again, 60, "state rejected", nodes)


class Watcher(threading.Thread):
    """A reader beside the swarm: lists the experiment folder as a node does and parses every file it sees.

    Any listed file that does not decode is a partial or torn file that a node could have read. Paths
    in ``planted`` (hostile files a test put there) are skipped. It also records every state it reads,
    to check that the round never goes backwards.
    """

    def __init__(
        self, folder: Path, planted: set[str] | None = None, torn_ok: set[str] | None = None, interval: float = 0.05
    ) -> None:
        super().__init__(daemon=True)
        self.storage = LocalStorage(folder)
        self.planted = planted if planted is not None else set()
        self.torn_ok = torn_ok or set()  # logs that a SIGKILL mid-append may leave one partial line in
        self.interval = interval
        self.halt = threading.Event()
        self.torn: list[str] = []
        self.states: list[tuple[int, int, str]] = []
        self.reads = 0

    def run(self) -> None:
        while not self.halt.wait(self.interval):
            try:
                self.sweep(LAYOUT.root)
            except Exception as exc:  # noqa: BLE001 - anything a reader could not cope with fails the trial
                self.torn.append(f"the reader failed: {type(exc).__name__}: {exc}")

    def sweep(self, rel: str) -> None:
        for info in self.storage.list(rel):
            path = f"{rel}/{info.name}"
            if info.is_dir:
                if not path.endswith("/checkpoints"):
                    self.sweep(path)
            elif path not in self.planted:
                self.check(path)

    def check(self, path: str) -> None:
        try:
            data = self.storage.read_bytes(path, 64 * 1024 * 1024)
        except FileNotFoundError:  # replaced or deleted between the listing and the read
            return
        self.reads += 1
        kind = path.split("/")[2]
        try:
            if path.endswith(".jsonl"):
                model = MetricRecord if path.endswith("metrics.jsonl") else EventRecord
                self.torn.extend(f"{path}: {p}" for p in check_log(data, model, path in self.torn_ok))
            elif path.endswith("experiment.json"):
                decode(data, ExperimentRecord)
            elif kind in KINDS:
                record = decode(data, KINDS[kind])
                if kind == "state" and (not self.states or self.states[-1][:2] != (record.round, record.seq)):
                    self.states.append((record.round, record.seq, record.status))
        except RecordError as exc:
            self.torn.append(f"{path}: {exc}")

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=10)

    def assert_clean(self) -> None:
        assert self.reads > 0, "the watcher read nothing"
        assert not self.torn, f"a reader saw partial or invalid files: {self.torn[:5]}"
        order = [(r, s) for r, s, _ in self.states]
        assert order == sorted(order), f"the state went backwards: {self.states}"


@dataclass
class Swarm:
    """A coordinator and workers as real processes on ``folder``; every process ever started is kept."""

    folder: Path
    env: dict[str, str]
    workers: list[str]
    extra: dict[str, dict[str, str]] = field(default_factory=dict)
    procs: list[NodeProcess] = field(default_factory=list)
    sink: Callable[[str], None] | None = None
    #: ROUND_MODE, given to the coordinator only: the workers follow the experiment's mode (§5.10).
    round_mode: str = "sync"

    def __post_init__(self) -> None:
        if self.sink is None:  # every node's output, interleaved, beside the folder: for post-mortems
            log, lock = (self.folder.parent / "nodes.log").open("a"), threading.Lock()

            def sink(line: str) -> None:
                with lock:
                    log.write(line + "\n")
                    log.flush()

            self.sink = sink

    def start(self, name: str, node: str | None = None, **more: str) -> NodeProcess:
        node = node or name
        env = {**self.env, "NODE_ID": node, **self.extra.get(name, {}), **more}
        if node == "coord":
            env["NODE_ROLE"] = "coordinator"
            env.setdefault("ROUND_MODE", self.round_mode)
        proc = NodeProcess(name, env, self.sink)
        self.procs.append(proc)
        return proc

    def start_all(self) -> None:
        self.start("coord")
        for w in self.workers:
            self.start(w)

    def wait(self, timeout: float) -> dict[str, int]:
        """Exit codes of the processes that were not killed, by name."""
        out = {}
        for p in self.procs:
            if p.returncode == -9:
                continue
            try:
                out[p.name] = p.wait(timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - reported with the logs below
                raise AssertionError(f"{p.name} did not finish: {exc}\n" + self.tails()) from None
        return out

    def stop(self) -> None:
        stop_all([p for p in self.procs if p.returncode is None], timeout=5)

    def tails(self, lines: int = 30) -> str:
        return "\n".join(f"--- {p.name} (exit {p.returncode})\n" + _tail(p, lines) for p in self.procs)

    def path(self, rel: str) -> Path:
        return self.folder / rel


def kill_parked(swarm: Swarm, proc: NodeProcess, marker_dir: Path, timeout: float = 90) -> str:
    """SIGKILL ``proc`` once the hook says it is parked at its fault point; returns the point."""
    marker = marker_dir / "parked"
    wait_until(lambda: marker.exists() or proc.returncode is not None, timeout, f"{proc.name} parked", swarm.procs)
    assert proc.returncode is None, f"{proc.name} exited ({proc.returncode}) before its fault point\n{swarm.tails()}"
    proc.kill()
    return marker.read_text()


def rewards_present(folder: Path, node: str) -> dict[int, RewardRecord]:
    """Every valid reward file of ``node``, by round (stage 0)."""
    out = {}
    base = folder / LAYOUT.rewards_dir
    for round_dir in base.iterdir() if base.exists() else []:
        round_ = parse_round_dir(round_dir.name)
        path = folder / LAYOUT.reward_file(round_, 0, node) if round_ is not None else None
        if path is not None and path.exists():
            out[round_] = decode(path.read_bytes(), RewardRecord)
    return out


def leftovers(folder: Path) -> list[str]:
    """Temporary files anywhere in the experiment folder."""
    return [str(p.relative_to(folder)) for p in (folder / LAYOUT.root).rglob("*") if is_temporary(p.name)]


def played_rounds(folder: Path, node: str, after: float = 0.0, torn_ok: bool = False) -> list[int]:
    """Rounds whose stage metric line ``node`` wrote after wall time ``after``, in order."""
    return [m.round for m in metrics(folder, node, torn_ok) if m.ts > after and "swarm/peers_read" in m.values]


def assert_swarm_finished(folder: Path, rounds: int, round_mode: str = "sync") -> StateRecord:
    state = read_record(folder, LAYOUT.state_file, StateRecord)
    experiment = read_record(folder, LAYOUT.experiment_file, ExperimentRecord)
    assert (state.status, state.round, state.run_id) == ("finished", rounds, experiment.run_id), state
    assert (state.mode, experiment.mode) == (round_mode, round_mode), (state, experiment)
    return state


def round_reached(folder: Path, round_: int, round_mode: str, node: str | None = None) -> bool:
    """Whether round ``round_`` is being played: in sync, the state has opened it; in async (no round clock),
    ``node`` (any worker when None or the coordinator) has submitted its reward of the round before, or, for round
    0, the state says running."""
    try:
        text = (folder / LAYOUT.state_file).read_text()
    except (OSError, ValueError):  # absent, or a planted folder or garbage there for now
        text = ""
    if round_mode == "sync" or round_ == 0:
        return f'"round":{round_},' in text and '"status":"running"' in text
    before = (folder / LAYOUT.reward_file(round_ - 1, 0, "x")).parent
    try:
        names = [p.name for p in before.iterdir() if not is_temporary(p.name)]
    except OSError:
        return False
    return f"{node}.json" in names if node not in (None, "coord") else bool(names)


def assert_every_round_submitted(folder: Path, node: str, rounds: range, skipped: set[int] = frozenset()) -> None:
    """``node`` has a valid reward and a complete rollout batch for every round of ``rounds`` it did not skip."""
    have = rewards_present(folder, node)
    for round_ in rounds:
        if round_ in skipped:
            continue
        assert round_ in have, f"{node}: no reward for round {round_} (has {sorted(have)})"
        batch = read_record(folder, LAYOUT.rollout_file(round_, 0, node), RolloutBatch)
        assert batch.complete and batch.groups, (node, round_)


def skipped_rounds(folder: Path, node: str, torn_ok: bool = False) -> set[int]:
    """The rounds ``node`` logged as skipped (``round_skipped``): rounds the swarm played without it, and rounds it
    never played because the experiment had finished when it came back (an async run ends without a dead worker).
    Those count only when the coordinator's own log says it finished before: a worker that trusted a forged
    ``finished`` is not excused."""
    try:
        finished = [e.ts for e in events(folder, "coord", torn_ok=True) if e.event == "experiment_finished"]
    except (AssertionError, OSError, ValueError):  # a log a planter replaced: nothing is excused by it
        finished = []
    out: set[int] = set()
    for e in events(folder, node, torn_ok):
        if e.event != "round_skipped":
            continue
        if e.message.startswith("the experiment finished before") and not any(t <= e.ts for t in finished):
            continue
        out.update(range(e.data["skipped_from"], e.data["skipped_to"] + 1))
    return out
