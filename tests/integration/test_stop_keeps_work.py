"""What a stop keeps (issue #27 review): a round trained in part is never checkpointed as whole, a worker that gives
up on a silent coordinator keeps its training, a stop checkpoint that fails still ends in a clean stop, and
``stop_all`` signals every process before it waits for any.

The worker tests run the real coordinator and worker as threads (tests/swarm_threads.py) with a synthetic workload
that records which rounds it ended and what the worker asked it to save.
"""

from __future__ import annotations

import json
import logging
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from swarm_gdrive.procs import NodeProcess, stop_all
from swarm_gdrive.protocol.coordinator import Coordinator
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import EventRecord, decode_lines
from swarm_gdrive.protocol.workload import StageContext, SyntheticWorkload
from swarm_gdrive.storage import LocalStorage
from swarm_gdrive.storage.base import StorageUnavailableError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from swarm_threads import Node, define_experiment, fast_env  # noqa: E402

pytestmark = pytest.mark.integration
LAYOUT = Layout("keep")


class Recording(SyntheticWorkload):
    """The synthetic workload with a model's bookkeeping: the last round it ended is what a stop would save."""

    stateless = False

    def __init__(self, node: Node, on_train, save_error: Exception | None) -> None:
        super().__init__(node.config.num_train_samples, node.config.num_generations, 0.0, node.stop)
        self.on_train = on_train
        self.save_error = save_error
        self.ended: int | None = None
        self.saves: list[int | None] = []  # the rounds the worker had saved before it exited

    def train(self, ctx: StageContext, local, external) -> dict[str, float]:
        metrics = super().train(ctx, local, external)
        self.on_train(ctx)
        return metrics

    def end_round(self, round_: int, final: bool) -> dict[str, float]:
        if not final:
            self.ended = round_
        return {}

    def checkpoint_on_stop(self) -> int | None:
        if self.save_error is not None:
            raise self.save_error
        self.saves.append(self.ended)
        return self.ended


class RecordingWorker(Node):
    def __init__(self, env: dict[str, str], on_train, save_error: Exception | None = None) -> None:
        super().__init__({**env, "NODE_ROLE": "worker", "NODE_ID": "w1"})
        self.on_train, self.save_error = on_train, save_error
        self.workload: Recording | None = None

    def make_workload(self) -> Recording:
        self.workload = Recording(self, self.on_train, self.save_error)
        return self.workload


class HangingStorage(LocalStorage):
    """The coordinator's folder: once ``crashed`` is set every write hangs until ``released`` (a crashed
    coordinator writes nothing more: no state, no heartbeat)."""

    def __init__(self, root: str, crashed: threading.Event, released: threading.Event) -> None:
        super().__init__(root)
        self.crashed, self.released = crashed, released

    def _hang(self) -> None:
        if self.crashed.is_set():
            self.released.wait()

    def write_bytes(self, path: str, data: bytes) -> None:
        self._hang()
        super().write_bytes(path, data)

    def append_bytes(self, path: str, data: bytes) -> None:
        self._hang()
        super().append_bytes(path, data)


class CoordinatorNode(Node):
    def __init__(self, env: dict[str, str], storage: LocalStorage | None = None) -> None:
        super().__init__({**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord"})
        self.storage = storage or LocalStorage(self.config.gdrive_path)

    def run(self) -> None:
        self.code = Coordinator(self.config, self.storage, self.config.node_id, self.stop).run()


def events(folder: Path, node: str) -> list[EventRecord]:
    found, problems = decode_lines((folder / LAYOUT.events_file(node)).read_bytes(), EventRecord)
    assert not problems
    return found


def run_pair(coordinator: Node, worker: RecordingWorker, timeout: float = 60) -> None:
    """Both nodes until the worker exits; then the coordinator is stopped."""
    coordinator.start()
    worker.start()
    worker.join(timeout)
    assert not worker.is_alive(), "the worker did not exit"
    coordinator.stop.set()
    coordinator.join(timeout)
    assert not coordinator.is_alive(), "the coordinator did not exit"


@pytest.mark.parametrize(
    ("stop_stage", "saved", "said"),
    [
        # stopped in round 1's first stage's update: round 1 is trained in part, no checkpoint can hold it
        (0, [], "without a stop checkpoint (round 1 was trained in part, 1 of 2 stages"),
        # stopped in its last stage's update: the round ends, and its stop checkpoint is saved
        (1, [1], "its training kept in a checkpoint of round 1"),
    ],
)
def test_a_stop_between_stages_saves_no_checkpoint_of_the_round_trained_in_part(tmp_path, stop_stage, saved, said):
    env = fast_env(tmp_path / "drive", "keep", NUM_STAGES=2, MAX_ROUNDS=6, MIN_WORKERS=1)
    (tmp_path / "drive").mkdir()

    def stop_in_round_1(ctx: StageContext) -> None:
        if (ctx.round, ctx.stage) == (1, stop_stage):
            worker.stop.set()

    worker = RecordingWorker(env, stop_in_round_1)
    run_pair(CoordinatorNode(env), worker)
    assert worker.code == 0
    assert worker.workload is not None and worker.workload.saves == saved
    (stopped,) = [e for e in events(tmp_path / "drive", "w1") if e.event == "worker_stopped"]
    assert said in stopped.message


def test_a_worker_that_gives_up_on_a_silent_coordinator_keeps_its_training(tmp_path):
    """The coordinator stops writing during round 0 (as if its runtime died); the worker, after
    COORDINATOR_WAIT_TIMEOUT, saves its stop checkpoint of round 0 and exits 3."""
    env = fast_env(tmp_path / "drive", "keep", MAX_ROUNDS=6, MIN_WORKERS=1, COORDINATOR_WAIT_TIMEOUT=3)
    (tmp_path / "drive").mkdir()
    crashed, released = threading.Event(), threading.Event()
    coordinator = CoordinatorNode(env, HangingStorage(str(tmp_path / "drive"), crashed, released))
    worker = RecordingWorker(env, lambda ctx: crashed.set())
    try:
        coordinator.start()
        worker.start()
        worker.join(60)
        assert not worker.is_alive(), "the worker did not give up"
    finally:
        released.set()
        coordinator.stop.set()
        coordinator.join(60)
    assert worker.code == 3
    assert worker.workload is not None and worker.workload.saves == [0]
    (gave_up,) = [e for e in events(tmp_path / "drive", "w1") if e.event == "worker_gave_up"]
    assert "did not reach round 1" in gave_up.message
    assert "its training kept in a checkpoint of round 0" in gave_up.message


@pytest.mark.parametrize(
    "error",
    [OSError(28, "No space left on device"), StorageUnavailableError("the Drive API answered 503 five times")],
)
def test_a_stop_checkpoint_that_fails_still_ends_in_a_clean_stop(tmp_path, error):
    env = fast_env(tmp_path / "drive", "keep", MAX_ROUNDS=6, MIN_WORKERS=1)
    (tmp_path / "drive").mkdir()

    def stop_in_round_1(ctx: StageContext) -> None:
        if ctx.round == 1:
            worker.stop.set()

    worker = RecordingWorker(env, stop_in_round_1, save_error=error)
    run_pair(CoordinatorNode(env), worker)
    assert worker.code == 0  # not a crash: no traceback out of the stop
    (stopped,) = [e for e in events(tmp_path / "drive", "w1") if e.event == "worker_stopped"]
    assert f"without a stop checkpoint ({type(error).__name__}: {error})" in stopped.message


CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    name, wait_for = sys.argv[1], sys.argv[2]
    folder = os.environ["MARKS"]

    def on_term(signum, frame):
        open(os.path.join(folder, name), "w").close()  # this child got its SIGTERM
        if wait_for == "ignore":
            return  # a node that never finishes its stop: SIGKILL at the deadline
        deadline = time.monotonic() + 20
        while wait_for != "-" and not os.path.exists(os.path.join(folder, wait_for)):
            if time.monotonic() > deadline:
                sys.exit(5)  # the other child was not signalled while this one stopped
            time.sleep(0.01)
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
    """
)


def test_stop_all_signals_every_process_before_it_waits_for_any(tmp_path):
    """The first child stops only once the second has its SIGTERM too (one after the other, it would wait in vain
    and exit 5); the third ignores SIGTERM and is killed at the shared deadline."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {"MARKS": str(tmp_path)}
    children = [
        NodeProcess("first", env, argv=[sys.executable, str(script), "first", "second"]),
        NodeProcess("second", env, argv=[sys.executable, str(script), "second", "-"]),
        NodeProcess("stuck", env, argv=[sys.executable, str(script), "stuck", "ignore"]),
    ]
    try:
        deadline = time.monotonic() + 60
        while not all("ready" in c.lines for c in children):
            assert time.monotonic() < deadline, [c.lines for c in children]
            time.sleep(0.02)
        codes = stop_all(children, timeout=8)
    finally:
        for child in children:
            if child.returncode is None:
                child.kill()
    assert codes == {"first": 0, "second": 0, "stuck": -9}
    assert {p.name for p in tmp_path.iterdir() if p.suffix != ".py"} == {"first", "second", "stuck"}


def tiny_workload(tmp_path: Path, tiny_folder: Path, **settings: str):
    """The real GRPO workload on the tiny model in a local folder whose experiment.json is written, CPU, no
    checkpoint due by rounds or the clock: (config, folder, workload)."""
    from swarm_gdrive.config import from_env
    from swarm_gdrive.training.grpo_workload import GRPOWorkload

    folder = tmp_path / "drive"
    folder.mkdir()
    config = from_env(
        {
            "GDRIVE_PATH": str(folder),
            "EXPERIMENT_NAME": "keep",
            "SWARM_LOCAL_DIR": str(tmp_path / "local"),
            "NODE_ID": "w1",
            "MODEL_NAME": str(tiny_folder),
            "WORKLOAD": "grpo",
            "TASKS": "basic_arithmetic",
            "NUM_TRAIN_SAMPLES": "2",
            "NUM_GENERATIONS": "2",
            "MAX_NEW_TOKENS": "8",
            "DEVICE": "cpu",
            "CHECKPOINT_INTERVAL": "0",
            "CHECKPOINT_MINUTES": "0",
            "STOP_CHECKPOINT_MIN_SECONDS": "0",
            **settings,
        }
    )
    storage = LocalStorage(folder)
    define_experiment(storage, config, "coord")
    return config, folder, GRPOWorkload(config, storage, "w1", threading.Event())


def test_the_grpo_workload_counts_a_round_as_trained_only_at_its_end(tmp_path, tiny_folder):
    """The real workload on the tiny model, NUM_STAGES=2: after round 1's first stage its weights hold part of
    round 1, and a stop checkpoint bears no round (one of round 1 would skip its second stage on resume); once
    round 1 has ended, the stop checkpoint is of round 1."""
    from swarm_gdrive.protocol.sapo import ScoredGroup

    config, folder, workload = tiny_workload(tmp_path, tiny_folder, NUM_STAGES="2")

    def train(round_: int, stage: int) -> None:
        ctx = StageContext("w1", round_, stage, config.seed)
        workload.train(ctx, [ScoredGroup("w1", g, tuple(g.rewards)) for g in workload.generate(ctx)], [])

    def saved_rounds() -> list[str]:
        base = folder / LAYOUT.checkpoint_dir("w1", 0).rsplit("/", 1)[0]
        return sorted(p.name for p in base.glob("round_*")) if base.exists() else []

    train(0, 0)
    train(0, 1)
    workload.end_round(0, final=False)
    train(1, 0)
    assert workload.checkpoint_on_stop() is None  # round 1 trained in part: no round can label these weights
    assert saved_rounds() == []
    train(1, 1)
    workload.end_round(1, final=False)
    assert workload.checkpoint_on_stop() == 1
    assert saved_rounds() == ["round_1"]


@pytest.mark.parametrize(("limit", "moments"), [(1e12, True), (0, False)])
def test_auto_saves_a_large_model_s_weights_alone_and_says_so_once(
    tmp_path, tiny_folder, monkeypatch, caplog, limit, moments
):
    """CHECKPOINT_OPTIMIZER=auto on the real workload: AdamW's moments are saved while they fit
    checkpoint.AUTO_MOMENTS_LIMIT_BYTES (the tiny model stands in for SmolLM2); over it (a limit of 0 stands in for
    Qwen2.5-0.5B's 494M weights) the checkpoint holds the weights alone, and the first save says so, once."""
    from safetensors.torch import load_file

    from swarm_gdrive.protocol.sapo import ScoredGroup
    from swarm_gdrive.training import checkpoint

    monkeypatch.setattr(checkpoint, "AUTO_MOMENTS_LIMIT_BYTES", limit)
    config, folder, workload = tiny_workload(tmp_path, tiny_folder)
    caplog.set_level(logging.INFO, logger="swarm_gdrive.training.grpo_workload")
    for round_ in (0, 1):
        ctx = StageContext("w1", round_, 0, config.seed)
        # Rewards that differ within each group, so the step is taken (AdamW then has moments to save).
        workload.train(ctx, [ScoredGroup("w1", g, (1.0, 0.0)) for g in workload.generate(ctx)], [])
        workload.end_round(round_, final=False)
        assert workload.checkpoint_on_stop() == round_
    saved = folder / LAYOUT.checkpoint_dir("w1", 1) / checkpoint.OPTIMIZER_FILE
    stored = load_file(str(saved))
    assert any(k.endswith("exp_avg") for k in stored) is moments
    assert json.loads(saved.with_name(checkpoint.STATE_FILE).read_text())["optimizer_state"] == (
        "bf16" if moments else "none"
    )
    said = [r for r in caplog.records if "checkpoints hold the weights alone" in r.getMessage()]
    assert len(said) == (0 if moments else 1)
