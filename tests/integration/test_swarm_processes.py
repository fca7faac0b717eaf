"""A coordinator and 3 workers as real processes on a temporary folder, with a worker SIGKILLed mid-round."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from swarm_gdrive.procs import NodeProcess, stop_all
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import (
    EventRecord,
    ExperimentRecord,
    MetricRecord,
    PeerRecord,
    RewardRecord,
    RolloutBatch,
    StateRecord,
    decode,
    decode_lines,
)
from swarm_gdrive.storage.base import is_temporary

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROUNDS = 5
WORKERS = ["worker-1", "worker-2", "worker-3"]
J = 2


def base_env(folder: Path) -> dict[str, str]:
    return {
        "GDRIVE_PATH": str(folder),
        "EXPERIMENT_NAME": "itest",
        "SWARM_LOCAL_DIR": str(folder.parent / "local"),
        "MAX_ROUNDS": str(ROUNDS),
        "NUM_TRANSPLANT_TREES": str(J),
        "NUM_TRAIN_SAMPLES": "4",
        "NUM_GENERATIONS": "4",
        "MIN_WORKERS": "3",
        "HEARTBEAT_INTERVAL": "0.3",
        "LIVENESS_TIMEOUT": "8",
        "POLL_INTERVAL_MIN": "0.05",
        "POLL_INTERVAL_MAX": "0.5",
        "COORDINATOR_ROUND_INTERVAL": "60",
        "ROLLOUT_WAIT_TIMEOUT": "30",
        "SYNTHETIC_STEP_SECONDS": "0.3",
        "WORKLOAD": "synthetic",
    }


def wait_until(predicate, timeout: float, what: str, nodes: list[NodeProcess]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {n.name}\n" + "\n".join(n.lines[-15:]) for n in nodes)
            raise AssertionError(f"timed out waiting for {what}\n{logs}")
        time.sleep(0.02)


def assert_every_file_final_and_valid(root: Path) -> None:
    """Nothing temporary or partial is left anywhere, and every file validates."""
    kinds = {"state": StateRecord, "peers": PeerRecord, "rewards": RewardRecord, "rollouts": RolloutBatch}
    for file in root.rglob("*"):
        assert not is_temporary(file.name), f"left behind: {file}"
        if file.is_dir():
            continue
        rel = file.relative_to(root).parts
        if file.suffix == ".json" and rel[0] in kinds:
            decode(file.read_bytes(), kinds[rel[0]])
        elif file.suffix == ".jsonl":
            model = MetricRecord if file.name == "metrics.jsonl" else EventRecord
            data = file.read_bytes()
            assert data.endswith(b"\n")
            records, problems = decode_lines(data, model)
            assert records and not problems
        else:
            assert file.name == "experiment.json"
            decode(file.read_bytes(), ExperimentRecord)


def test_three_workers_five_rounds_with_a_sigkilled_worker(tmp_path):
    folder = tmp_path / "drive"
    folder.mkdir()
    env = base_env(folder)
    layout = Layout("itest")
    root = folder / layout.root

    def path(rel: str) -> Path:
        return folder / rel

    nodes = [NodeProcess("coordinator", {**env, "NODE_ROLE": "coordinator", "NODE_ID": "coordinator"})]
    # worker-3's first life trains slowly, so that the kill lands inside its round-2 update.
    workers = {
        w: NodeProcess(w, {**env, "NODE_ID": w, **({"SYNTHETIC_STEP_SECONDS": "4"} if w == "worker-3" else {})})
        for w in WORKERS
    }
    nodes += workers.values()
    try:
        victim = workers["worker-3"]
        wait_until(
            lambda: path(layout.rollout_file(2, 0, "worker-3")).exists(), 90, "worker-3 publishing round 2", nodes
        )
        victim.kill()
        assert not path(layout.reward_file(2, 0, "worker-3")).exists(), "the kill should land mid-round"
        # The others keep going: they finish round 2 while worker-3 is dead.
        wait_until(
            lambda: all(path(layout.reward_file(2, 0, w)).exists() for w in ("worker-1", "worker-2")),
            30,
            "survivors submitting round 2",
            nodes,
        )
        assert all(workers[w].returncode is None for w in ("worker-1", "worker-2"))
        state_at_restart = decode(path(layout.state_file).read_bytes(), StateRecord)
        restarted = NodeProcess("worker-3b", {**env, "NODE_ID": "worker-3"})
        nodes.append(restarted)
        codes = {n.name: n.wait(timeout=120) for n in nodes if n is not victim}
    finally:
        stop_all([n for n in nodes if n.returncode is None], timeout=5)
    assert codes == {"coordinator": 0, "worker-1": 0, "worker-2": 0, "worker-3b": 0}, codes

    # The experiment finished after every round.
    state = decode(path(layout.state_file).read_bytes(), StateRecord)
    experiment = decode(path(layout.experiment_file).read_bytes(), ExperimentRecord)
    assert (state.status, state.round, state.run_id) == ("finished", ROUNDS, experiment.run_id)

    # Every worker has a valid reward for every round.
    for round_ in range(ROUNDS):
        for w in WORKERS:
            reward = decode(path(layout.reward_file(round_, 0, w)).read_bytes(), RewardRecord)
            assert reward.round == round_ and reward.num_local_groups == 4 and reward.external_requested == J

    # Every worker read at least 2 peers' rollouts in every round, and used J of them when J were usable.
    for w in WORKERS:
        metrics, problems = decode_lines(path(layout.metrics_file(w)).read_bytes(), MetricRecord)
        assert not problems
        stage_lines = [m for m in metrics if "swarm/peers_read" in m.values]
        by_round = {}
        for m in stage_lines:
            by_round.setdefault(m.round, []).append(m.values)
        assert sorted(by_round) == list(range(ROUNDS)), (w, sorted(by_round))
        for round_, lines in by_round.items():
            for v in lines:
                assert v["swarm/peers_read"] >= 2, (w, round_, v)
                usable = v["swarm/external_offered"] - v["swarm/external_zero_variance"]
                assert v["swarm/external_used"] == min(J, usable), (w, round_, v)

    # The restarted worker rejoined at the round that was current when it came back.
    events, _ = decode_lines(path(layout.events_file("worker-3")).read_bytes(), EventRecord)
    starts = [e for e in events if e.event == "worker_started"]
    assert len(starts) == 2
    after_restart = [
        m
        for m in decode_lines(path(layout.metrics_file("worker-3")).read_bytes(), MetricRecord)[0]
        if m.ts > starts[1].ts and "swarm/peers_read" in m.values
    ]
    assert after_restart[0].round == state_at_restart.round
    assert not any(e.event == "round_skipped" for e in events)

    assert_every_file_final_and_valid(root)

    # Clean exits mark peers stopped, so nobody waits for them.
    for w in WORKERS:
        assert decode(path(layout.peer_file(w)).read_bytes(), PeerRecord).status == "stopped"


def test_a_sigkilled_coordinator_restarts_where_it_was_and_the_round_never_goes_back(tmp_path):
    folder = tmp_path / "drive"
    folder.mkdir()
    env = {**base_env(folder), "MIN_WORKERS": "2", "MAX_ROUNDS": "4", "SYNTHETIC_STEP_SECONDS": "0.2"}
    layout = Layout("itest")
    state_file = folder / layout.state_file
    coordinator_env = {**env, "NODE_ROLE": "coordinator", "NODE_ID": "coordinator"}
    nodes = [NodeProcess("coordinator", coordinator_env)]
    nodes += [NodeProcess(w, {**env, "NODE_ID": w}) for w in WORKERS[:2]]
    seen: list[tuple[int, int, str]] = []

    def observe() -> StateRecord | None:
        try:
            s = decode(state_file.read_bytes(), StateRecord)
        except (FileNotFoundError, ValueError):
            return None
        if not seen or seen[-1] != (s.round, s.seq, s.status):
            seen.append((s.round, s.seq, s.status))
        return s

    try:
        wait_until(lambda: (s := observe()) is not None and s.round >= 2, 60, "round 2", nodes)
        nodes[0].kill()
        killed_at = observe()
        nodes.append(NodeProcess("coordinator-b", coordinator_env))
        deadline = time.monotonic() + 90
        while any(n.returncode is None for n in nodes[1:]) and time.monotonic() < deadline:
            observe()
            time.sleep(0.01)
        codes = {n.name: n.wait(timeout=30) for n in nodes[1:]}
    finally:
        stop_all([n for n in nodes if n.returncode is None], timeout=5)
    assert codes == {"worker-1": 0, "worker-2": 0, "coordinator-b": 0}
    final = observe()
    assert final.status == "finished" and final.round == 4 and final.run_id == killed_at.run_id
    rounds = [r for r, _, _ in seen]
    assert rounds == sorted(rounds), seen
    assert [s for _, s, _ in seen] == sorted(s for _, s, _ in seen), seen
    for round_ in range(4):
        for w in WORKERS[:2]:
            assert (folder / layout.reward_file(round_, 0, w)).exists()
    events, _ = decode_lines((folder / layout.events_file("coordinator")).read_bytes(), EventRecord)
    resumed = [e for e in events if e.event == "coordinator_resumed"]
    assert len(resumed) == 1 and resumed[0].round == killed_at.round


def test_monitor_and_validator_report_a_dead_worker_and_its_missing_rounds(tmp_path):
    """A worker SIGKILLed for good: the swarm finishes on the interval, and the monitor says what happened."""
    from swarm_gdrive.observe.monitor import findings, load, validate
    from swarm_gdrive.storage import LocalStorage

    folder = tmp_path / "drive"
    folder.mkdir()
    env = {
        **base_env(folder),
        "MIN_WORKERS": "2",
        "MAX_ROUNDS": "3",
        "NUM_TRANSPLANT_TREES": "1",
        "COORDINATOR_ROUND_INTERVAL": "2",
        "ROLLOUT_WAIT_TIMEOUT": "1",
        "LIVENESS_TIMEOUT": "60",
        "SYNTHETIC_STEP_SECONDS": "0.1",
    }
    layout = Layout("itest")
    nodes = [NodeProcess("coordinator", {**env, "NODE_ROLE": "coordinator", "NODE_ID": "coordinator"})]
    nodes += [NodeProcess(w, {**env, "NODE_ID": w}) for w in WORKERS[:2]]
    try:
        wait_until(lambda: (folder / layout.reward_file(0, 0, "worker-2")).exists(), 60, "round 0", nodes)
        nodes[2].kill()  # worker-2 dies for good
        codes = [nodes[0].wait(timeout=60), nodes[1].wait(timeout=60)]
    finally:
        stop_all([n for n in nodes if n.returncode is None], timeout=5)
    assert codes == [0, 0]
    snapshot = load(LocalStorage(folder), "itest", liveness_timeout=1.0)
    failed = validate(snapshot, rounds=3, nodes=2, transplants=1)
    assert any("worker-2" in m and "reward" in m for m in failed), failed
    found = {(f.code, f.severity): f.message for f in findings(snapshot, liveness_timeout=1.0)}
    assert any(code == "stale_heartbeat" and "worker-2" in msg for (code, _), msg in found.items()), found
    assert any(code == "missing_reward" and "worker-2" in msg for (code, _), msg in found.items()), found
    # worker-1 is healthy; the one thing to say of it is true: with its only peer dead it got no external group
    assert "worker-1" in found[("sapo_starved", "warning")]
    assert not any(
        "worker-1" in msg for (code, _), msg in found.items() if code not in ("state", "storage", "sapo_starved")
    )


def test_a_node_never_imports_a_module_planted_in_the_folder_it_was_started_from(tmp_path, monkeypatch):
    """A node is ``python -m swarm_gdrive.launcher``, which would put the working directory first on its path: a
    package planted there under the name of one it imports (here ``swarm_gdrive`` itself; a shared folder's root is
    writable by every participant, and someone may start a node from it) must not run."""
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "ran"
    fake = tmp_path / "swarm_gdrive"
    fake.mkdir()
    (fake / "__init__.py").write_text(f"open({str(marker)!r}, 'a').write('planted')\n")
    (fake / "launcher.py").write_text("")
    node = NodeProcess("w1", {"GDRIVE_PATH": "", "NODE_ROLE": "worker"})
    try:
        code = node.wait(timeout=120)
    finally:
        stop_all([node])
    assert not marker.exists(), node.lines[-10:]
    assert code == 2 and any("GDRIVE_PATH" in line for line in node.lines), node.lines[-10:]  # the real launcher
