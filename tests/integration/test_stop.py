"""A stop keeps the work, and the coordinator's stop reaches the workers (issue #27, Build points 2 and 3).

A worker stopped by SIGTERM or the notebook's stop button saves a checkpoint of the last round it trained before it
exits (unless its latest checkpoint is younger than STOP_CHECKPOINT_MIN_SECONDS), and a restarted worker resumes
from it. A coordinator stopped before the experiment finished writes the state ``stopped``: the workers that
followed it say so, checkpoint and exit 0; a worker started meanwhile waits for it; ``status`` says the coordinator
is gone; a restarted coordinator resumes the round.
"""

from __future__ import annotations

import _thread
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from swarm_gdrive.config import env_fields
from swarm_gdrive.procs import NodeProcess, stop_all
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import EventRecord, RewardRecord, StateRecord, decode, decode_lines
from swarm_gdrive.storage import LocalStorage
from swarm_gdrive.training.checkpoint import load_latest, param_digest, parse_manifest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from swarm_threads import define_experiment, fast_env  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]
LAYOUT = Layout("stop")


@pytest.fixture(scope="module")
def model_dir(tiny_folder) -> Path:
    return tiny_folder


def tiny_env(folder: Path, model: Path, **extra: object) -> dict[str, str]:
    """One worker at a time training the tiny model, with no checkpoint but the ones a stop makes."""
    env = {
        "GDRIVE_PATH": str(folder),
        "EXPERIMENT_NAME": "stop",
        "SWARM_LOCAL_DIR": str(folder.parent / "local"),
        "MODEL_NAME": str(model),
        "WORKLOAD": "grpo",
        "TASKS": "basic_arithmetic",
        "TASK_CONFIG": '{"basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}',
        "NUM_TRAIN_SAMPLES": "2",
        "NUM_GENERATIONS": "4",
        "NUM_TRANSPLANT_TREES": "0",
        "MAX_NEW_TOKENS": "8",
        "LEARNING_RATE": "1e-3",
        "CHECKPOINT_INTERVAL": "1000",  # and CHECKPOINT_MINUTES=0: no checkpoint on the rounds' clock
        "CHECKPOINT_MINUTES": "0",
        "DEVICE": "cpu",
        "OMP_NUM_THREADS": "1",
        "MIN_WORKERS": "1",
        "MAX_ROUNDS": "100",
        "HEARTBEAT_INTERVAL": "0.5",
        "LIVENESS_TIMEOUT": "120",
        "POLL_INTERVAL_MIN": "0.05",
        "POLL_INTERVAL_MAX": "0.5",
        "COORDINATOR_ROUND_INTERVAL": "300",
    }
    return {**env, **{k: str(v) for k, v in extra.items()}}


def wait_until(predicate, timeout: float, what: str, nodes: list[NodeProcess]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {n.name}\n" + "\n".join(n.lines[-20:]) for n in nodes)
            raise AssertionError(f"timed out waiting for {what}\n{logs}")
        time.sleep(0.05)


def node_events(folder: Path, node: str) -> list[EventRecord]:
    events, problems = decode_lines((folder / LAYOUT.events_file(node)).read_bytes(), EventRecord)
    assert not problems
    return events


def rewarded_rounds(folder: Path, node: str) -> list[int]:
    """The rounds ``node`` submitted a reward for (one stage a round)."""
    rounds = []
    for path in (folder / LAYOUT.rewards_dir).glob(f"round_*/stage_0/{node}.json"):
        rounds.append(decode(path.read_bytes(), RewardRecord).round)
    return sorted(rounds)


def checkpoint_rounds(folder: Path, node: str) -> list[int]:
    """The rounds of ``node``'s complete checkpoints (a manifest that says so)."""
    base = folder / LAYOUT.checkpoint_dir(node, 0).rsplit("/", 1)[0]
    complete = []
    for manifest in base.glob("round_*/checkpoint.json") if base.exists() else []:
        parsed = parse_manifest(manifest.read_bytes())
        if parsed.complete:
            complete.append(parsed.round)
    return sorted(complete)


def digest_of(folder: Path, node: str, round_: int) -> str:
    saved = load_file(str(folder / LAYOUT.checkpoint_dir(node, round_) / "model.safetensors"))

    class Holder(torch.nn.Module):
        def state_dict(self, *args, **kwargs):
            return saved

    return param_digest(Holder())


def test_sigterm_keeps_the_last_round_trained_and_a_restarted_worker_resumes_from_it(tmp_path, model_dir):
    """No checkpoint is due on the rounds' clock, yet a worker stopped by SIGTERM leaves one of the last round it
    submitted; the worker started again restores exactly those weights and plays the next round."""
    folder = tmp_path / "drive"
    folder.mkdir()
    env = tiny_env(folder, model_dir, MAX_ROUNDS=6)
    coordinator = NodeProcess("coordinator", {**env, "NODE_ROLE": "coordinator", "NODE_ID": "coordinator"})
    worker = NodeProcess("w1", {**env, "NODE_ID": "w1"})
    nodes = [coordinator, worker]
    try:
        wait_until(lambda: 2 in rewarded_rounds(folder, "w1"), 240, "w1's reward of round 2", nodes)
        assert checkpoint_rounds(folder, "w1") == []  # nothing on the rounds' clock so far
        assert worker.terminate(timeout=120) == 0, worker.lines[-20:]
        last = max(rewarded_rounds(folder, "w1"))
        assert last >= 2
        assert checkpoint_rounds(folder, "w1") == [last]  # the round it was in when stopped, not an older one
        (saved,) = [e for e in node_events(folder, "w1") if e.event == "checkpoint_on_stop"]
        assert saved.data["checkpoint_round"] == last
        assert any("received SIGTERM" in line and "saving a checkpoint" in line for line in worker.lines)
        stop_saved = digest_of(folder, "w1", last)  # now: the run's last checkpoint may prune it (KEEP_CHECKPOINTS)

        again = NodeProcess("w1-again", {**env, "NODE_ID": "w1"})
        nodes.append(again)
        assert again.wait(timeout=300) == 0, again.lines[-20:]
        assert coordinator.wait(timeout=60) == 0, coordinator.lines[-20:]
    finally:
        stop_all([n for n in nodes if n.returncode is None], timeout=5)
    (resumed,) = [e for e in node_events(folder, "w1") if e.event == "resumed_from_checkpoint"]
    assert resumed.data["checkpoint_round"] == last
    assert resumed.data["params"] == stop_saved
    assert rewarded_rounds(folder, "w1") == list(range(6))  # no round lost, none played twice


def test_the_stop_button_of_an_in_kernel_worker_saves_a_checkpoint(tmp_path, model_dir):
    """notebook.run_node_here (worker.ipynb): the KeyboardInterrupt Colab's stop button raises makes the worker
    save a checkpoint of the last round it submitted and return 0."""
    from swarm_gdrive import notebook

    folder = tmp_path / "drive"
    folder.mkdir()
    env = tiny_env(folder, model_dir, MAX_ROUNDS=50)
    coordinator = NodeProcess("coordinator", {**env, "NODE_ROLE": "coordinator", "NODE_ID": "coordinator"})
    pressed = threading.Event()

    def press_stop_after_round_1() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not pressed.is_set():
            if 1 in rewarded_rounds(folder, "w1"):
                pressed.set()
                _thread.interrupt_main()  # what the stop button does to the kernel
                return
            time.sleep(0.05)

    presser = threading.Thread(target=press_stop_after_round_1, daemon=True)
    presser.start()
    try:
        code = notebook.run_node_here({**env, "NODE_ID": "w1"})
    finally:
        pressed.set()
        stop_all([coordinator], timeout=30)
    assert code == 0
    last = max(rewarded_rounds(folder, "w1"))
    assert last >= 1
    assert checkpoint_rounds(folder, "w1") == [last]
    assert [e.data["checkpoint_round"] for e in node_events(folder, "w1") if e.event == "checkpoint_on_stop"] == [last]
    restored = load_latest(LocalStorage(folder), LAYOUT, "w1", tmp_path / "restore")  # every file's size and sha256
    assert restored is not None and restored.round == last


def test_a_checkpoint_younger_than_the_minimum_is_not_written_again(tmp_path, model_dir):
    """The workload itself, three rounds: the checkpoint of round 1 (CHECKPOINT_INTERVAL=2) is younger than
    STOP_CHECKPOINT_MIN_SECONDS, so a stop after round 2 writes none; with the minimum at 0 it writes round 2's,
    and a second stop finds round 2 already kept."""
    from dataclasses import replace

    from swarm_gdrive.config import from_env
    from swarm_gdrive.protocol.sapo import ScoredGroup
    from swarm_gdrive.protocol.workload import StageContext
    from swarm_gdrive.training.grpo_workload import GRPOWorkload

    folder = tmp_path / "drive"
    folder.mkdir()
    env = tiny_env(
        folder, model_dir, CHECKPOINT_INTERVAL=2, STOP_CHECKPOINT_MIN_SECONDS=10**6, NODE_ID="w1", KEEP_CHECKPOINTS=2
    )
    config = from_env(env)
    storage = LocalStorage(folder)
    define_experiment(storage, config, "coordinator")
    torch.set_num_threads(1)
    workload = GRPOWorkload(config, storage, "w1", threading.Event())
    for round_ in range(3):
        ctx = StageContext("w1", round_, 0, config.seed)
        groups = [ScoredGroup("w1", g, tuple(g.rewards)) for g in workload.generate(ctx)]
        workload.train(ctx, groups, [])
        workload.end_round(round_, final=False)
    assert checkpoint_rounds(folder, "w1") == [1]
    assert workload.checkpoint_on_stop() is None
    assert checkpoint_rounds(folder, "w1") == [1]  # round 2 not written: round 1's is younger than the minimum

    workload.config = replace(config, stop_checkpoint_min_seconds=0.0)
    assert workload.checkpoint_on_stop() == 2
    assert checkpoint_rounds(folder, "w1") == [1, 2]
    assert workload.checkpoint_on_stop() is None  # round 2 is kept already


def test_the_coordinators_stop_reaches_the_workers_and_status_says_so(tmp_path):
    """A coordinator stopped mid-run writes ``stopped``: both workers say so, name the coordinator and how to go
    on, and exit 0; ``swarm-gdrive status`` says the coordinator stopped; a worker started while it is stopped
    waits for it, and the coordinator started again resumes the round and the swarm finishes."""
    folder = tmp_path / "drive"
    folder.mkdir()
    env = fast_env(
        folder, "stop", MAX_ROUNDS=200, MIN_WORKERS=2, SYNTHETIC_STEP_SECONDS=0.05, COORDINATOR_WAIT_TIMEOUT=300
    )
    coordinator = NodeProcess("coord", {**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord"})
    workers = [NodeProcess(w, {**env, "NODE_ID": w}) for w in ("w1", "w2")]
    nodes = [coordinator, *workers]
    try:
        wait_until(lambda: 2 in rewarded_rounds(folder, "w1"), 120, "round 2", nodes)
        assert coordinator.terminate(timeout=60) == 0, coordinator.lines[-20:]
        state = decode((folder / LAYOUT.state_file).read_bytes(), StateRecord)
        assert state.status == "stopped" and state.round < 200
        stopped_at = state.round
        for w in workers:  # they exit on their own: nobody stops them
            assert w.wait(timeout=120) == 0, w.lines[-20:]
            said = [line for line in w.lines if "coordinator_stopped" in line]
            assert said and f"coordinator coord stopped the experiment at round {stopped_at}" in said[-1], w.lines[-5:]
            assert "start coordinator coord again" in said[-1]
            assert max(rewarded_rounds(folder, w.name)) <= stopped_at

        status = subprocess.run(
            [sys.executable, "-m", "swarm_gdrive", "status", "--folder", str(folder), "--experiment", "stop"],
            capture_output=True,
            text=True,
            timeout=120,
            env={k: v for k, v in os.environ.items() if k not in {f.metadata["env"] for f in env_fields()}},
        )
        assert status.returncode == 0, status.stderr
        assert f"experiment stop: stopped, round {stopped_at} of 200" in status.stdout, status.stdout
        assert "coordinator coord stopped" in status.stdout and "workers still beating: none" in status.stdout
        assert "live workers: w1" not in status.stdout
        assert "coordinator_stopped: coordinator coord stopped" in status.stdout, status.stdout

        # Started while the coordinator is stopped: a worker waits for it and says so, rather than exit.
        late = NodeProcess("w1-late", {**env, "NODE_ID": "w1", "MAX_ROUNDS": "200"})
        nodes.append(late)
        wait_until(lambda: any("coordinator coord is stopped" in x for x in late.lines), 60, "the wait", nodes)
        assert late.returncode is None
        w2 = NodeProcess("w2-again", {**env, "NODE_ID": "w2"})
        again = NodeProcess("coord-again", {**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord"})
        nodes += [w2, again]
        wait_until(lambda: stopped_at + 1 in rewarded_rounds(folder, "w1"), 120, "the round after the stop", nodes)
        state = decode((folder / LAYOUT.state_file).read_bytes(), StateRecord)
        assert state.status == "running"
        resumed = [e for e in node_events(folder, "coord") if e.event == "coordinator_resumed"]
        assert resumed and resumed[-1].round == stopped_at
    finally:
        stop_all([n for n in nodes if n.returncode is None], timeout=10)


def test_a_second_press_of_the_stop_button_interrupts_the_stop_at_once(tmp_path, monkeypatch):
    """The first press asks for a clean stop; a second one, while the worker is still stopping (here its
    checkpoint save, made endless by a test double), ends it at once: run_node_here returns, and the node's
    ``finally`` blocks have run (its peer file says stopped)."""
    from swarm_gdrive import notebook
    from swarm_gdrive.protocol.records import PeerRecord
    from swarm_gdrive.protocol.workload import SyntheticWorkload

    saving = threading.Event()

    def endless_save(self) -> int | None:
        saving.set()
        while True:  # Python bytecode between sleeps: where the second interrupt lands
            time.sleep(0.02)

    monkeypatch.setattr(SyntheticWorkload, "checkpoint_on_stop", endless_save)
    folder = tmp_path / "drive"
    folder.mkdir()
    env = fast_env(folder, "stop", MAX_ROUNDS=200, MIN_WORKERS=1, SYNTHETIC_STEP_SECONDS=0.05)
    coordinator = NodeProcess("coord", {**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord"})

    def press_twice() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and 1 not in rewarded_rounds(folder, "w1"):
            time.sleep(0.05)
        _thread.interrupt_main()
        if saving.wait(60):
            _thread.interrupt_main()

    presser = threading.Thread(target=press_twice, daemon=True)
    presser.start()
    try:
        code = notebook.run_node_here({**env, "NODE_ID": "w1"})
    finally:
        stop_all([coordinator], timeout=30)
    assert saving.is_set() and code == 1
    assert decode((folder / LAYOUT.peer_file("w1")).read_bytes(), PeerRecord).status == "stopped"


def test_workers_waiting_for_round_0_stop_with_their_coordinator(tmp_path, monkeypatch):
    """The coordinator stopped while round 0 still waits for MIN_WORKERS: the worker that joined it stops too
    (exit 0, coordinator_stopped), instead of waiting COORDINATOR_WAIT_TIMEOUT for a round that will not open."""
    from swarm_threads import Node

    from swarm_gdrive.protocol.trust import StateFollower

    seen_waiting = threading.Event()
    read = StateFollower.read

    def spy(self, target):  # the worker has trusted the coordinator's 'waiting' state: it has joined it
        state = read(self, target)
        if state is not None and state.status == "waiting":
            seen_waiting.set()
        return state

    monkeypatch.setattr(StateFollower, "read", spy)
    folder = tmp_path / "drive"
    folder.mkdir()
    env = fast_env(folder, "stop", MIN_WORKERS=2, COORDINATOR_WAIT_TIMEOUT=300)
    coordinator = Node({**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord"})
    worker = Node({**env, "NODE_ROLE": "worker", "NODE_ID": "w1"})
    coordinator.start()
    worker.start()
    try:
        assert seen_waiting.wait(60)
        coordinator.stop.set()
        coordinator.join(60)
        worker.join(120)  # nobody stops it: it reads 'stopped'
        assert coordinator.code == 0 and worker.code == 0
        state = decode((folder / LAYOUT.state_file).read_bytes(), StateRecord)
        assert (state.status, state.round) == ("stopped", 0)
        said = [e for e in node_events(folder, "w1") if e.event == "coordinator_stopped"]
        assert said and "coordinator coord stopped the experiment at round 0" in said[0].message
    finally:
        coordinator.stop.set()
        worker.stop.set()
