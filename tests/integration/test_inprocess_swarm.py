"""The real coordinator and workers as threads of one process: publish frequencies, retention, skipping."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from swarm_gdrive.config import from_env
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import (
    EventRecord,
    ExperimentRecord,
    MetricRecord,
    PeerRecord,
    RolloutBatch,
    decode,
    decode_lines,
    encode,
)
from swarm_gdrive.storage import LocalStorage

pytestmark = pytest.mark.integration
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from swarm_threads import Node, fast_env, run_threads  # noqa: E402

LAYOUT = Layout("inproc")


def env_for(folder: Path, **extra: object) -> dict[str, str]:
    return fast_env(folder, "inproc", **extra)


def run_swarm(folder: Path, workers: int, timeout: float = 60, **extra: object) -> list[Node]:
    return run_threads(env_for(folder, MIN_WORKERS=workers, **extra), workers, timeout)


@pytest.mark.parametrize("frequency", ["generation", "stage", "round"])
def test_publish_frequencies_all_share_complete_batches(tmp_path, frequency):
    stages = 1 if frequency == "round" else 2  # round with several stages and J > 0 is refused by config
    run_swarm(tmp_path, 2, MAX_ROUNDS=2, NUM_STAGES=stages, NUM_TRANSPLANT_TREES=1, ROLLOUT_PUBLISH_FREQUENCY=frequency)
    for round_ in range(2):
        for stage in range(stages):
            for w in ("w1", "w2"):
                batch = decode((tmp_path / LAYOUT.rollout_file(round_, stage, w)).read_bytes(), RolloutBatch)
                assert batch.complete and len(batch.groups) == 3
    metrics, _ = decode_lines((tmp_path / LAYOUT.metrics_file("w1")).read_bytes(), MetricRecord)
    writes = [m.values["storage/writes"] for m in metrics if "storage/writes" in m.values]
    assert len(writes) == 2
    # generation writes the file after each of the 3 groups; stage and round write it once per stage.
    rollout_writes = {"generation": stages * 3, "stage": stages, "round": stages}[frequency]
    assert min(writes) >= rollout_writes + stages  # + one reward per stage
    peers = [m.values["swarm/peers_read"] for m in metrics if "swarm/peers_read" in m.values]
    assert peers == [1] * (2 * stages)


def test_round_publishing_with_several_stages_and_transplants_is_refused():
    from swarm_gdrive.config import ConfigError

    with pytest.raises(ConfigError, match="ROLLOUT_PUBLISH_FREQUENCY='round'"):
        from_env(
            {
                "GDRIVE_PATH": "/tmp",
                "ROLLOUT_PUBLISH_FREQUENCY": "round",
                "NUM_STAGES": "2",
                "NUM_TRANSPLANT_TREES": "1",
            }
        )


@pytest.mark.parametrize("archive", [False, True])
def test_retention_keeps_the_last_n_rounds_of_own_files_only(tmp_path, archive):
    stranger = tmp_path / LAYOUT.rollout_file(0, 0, "stranger")
    stranger.parent.mkdir(parents=True)
    stranger.write_text("{}")
    run_swarm(
        tmp_path,
        2,
        MAX_ROUNDS=6,
        ROLLOUT_CLEANUP_ENABLED="true",
        ROLLOUT_KEEP_LAST_N_ROUNDS=2,
        ROLLOUT_ARCHIVE_OLD=str(archive).lower(),
    )
    for w in ("w1", "w2"):
        kept = sorted(r for r in range(6) if (tmp_path / LAYOUT.rollout_file(r, 0, w)).exists())
        assert kept == [4, 5]
        archived = sorted(r for r in range(6) if (tmp_path / LAYOUT.archived_rollout_file(r, 0, w)).exists())
        assert archived == ([0, 1, 2, 3] if archive else [])
        for r in archived:
            decode((tmp_path / LAYOUT.archived_rollout_file(r, 0, w)).read_bytes(), RolloutBatch)
    assert stranger.exists(), "a node removes only its own files"
    assert not (tmp_path / LAYOUT.rollouts_round_dir(1)).exists(), "the coordinator prunes emptied round folders"
    # Rewards are never cleaned: the monitor needs them.
    assert all((tmp_path / LAYOUT.reward_file(r, 0, "w1")).exists() for r in range(6))


def test_a_late_worker_skips_to_the_current_round_and_records_it(tmp_path):
    env = env_for(tmp_path, MAX_ROUNDS=40, MIN_WORKERS=1, SYNTHETIC_STEP_SECONDS=0.05)
    coordinator = Node({**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord"})
    early = Node({**env, "NODE_ROLE": "worker", "NODE_ID": "w1"})
    coordinator.start()
    early.start()
    state_file = tmp_path / LAYOUT.state_file
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not state_file.exists() or b'"round":3,' not in state_file.read_bytes()):
        time.sleep(0.01)
    late = Node({**env, "NODE_ROLE": "worker", "NODE_ID": "w2"})
    late.start()
    for n in (coordinator, early, late):
        n.join(60)
    assert [n.code for n in (coordinator, early, late)] == [0, 0, 0]
    events, _ = decode_lines((tmp_path / LAYOUT.events_file("w2")).read_bytes(), EventRecord)
    (skip,) = [e for e in events if e.event == "round_skipped"]
    assert skip.data["skipped_from"] == 0 and skip.data["skipped_to"] >= 2
    assert not (tmp_path / LAYOUT.reward_file(0, 0, "w2")).exists()
    assert (tmp_path / LAYOUT.reward_file(39, 0, "w2")).exists()


def test_a_live_peer_that_never_publishes_costs_one_bounded_wait_and_one_interval(tmp_path):
    """'ghost' heartbeats but never publishes nor submits: w1 waits ROLLOUT_WAIT_TIMEOUT for its rollouts
    and trains without them; the coordinator closes the round by the interval."""
    env = env_for(
        tmp_path,
        MAX_ROUNDS=1,
        MIN_WORKERS=2,
        NUM_TRANSPLANT_TREES=2,
        ROLLOUT_WAIT_TIMEOUT=1.0,
        COORDINATOR_ROUND_INTERVAL=3,
    )
    coordinator = Node({**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord"})
    w1 = Node({**env, "NODE_ROLE": "worker", "NODE_ID": "w1"})
    coordinator.start()
    w1.start()
    storage = LocalStorage(tmp_path)
    stop_ghost = threading.Event()

    def ghost() -> None:
        beat = 0
        while not stop_ghost.wait(0.1):
            experiment = tmp_path / LAYOUT.experiment_file
            if not experiment.exists():
                continue
            run_id = decode(experiment.read_bytes(), ExperimentRecord).run_id
            beat += 1
            storage.write_bytes(
                LAYOUT.peer_file("ghost"),
                encode(
                    PeerRecord(
                        node_id="ghost",
                        role="worker",
                        run_id=run_id,
                        registered_at=1.0,
                        heartbeat=beat,
                        heartbeat_at=1.0,
                        status="alive",
                    )
                ),
            )

    beating = threading.Thread(target=ghost, daemon=True)
    beating.start()
    started = time.monotonic()
    w1.join(30)
    coordinator.join(30)
    elapsed = time.monotonic() - started
    stop_ghost.set()
    assert (w1.code, coordinator.code) == (0, 0)
    events, _ = decode_lines((tmp_path / LAYOUT.events_file("w1")).read_bytes(), EventRecord)
    (expired,) = [e for e in events if e.event == "rollout_wait_expired"]
    assert expired.data["missing"] == ["ghost"]
    (shortfall,) = [e for e in events if e.event == "external_shortfall"]
    assert shortfall.data["used"] == 0 and shortfall.data["requested"] == 2
    coord_events, _ = decode_lines((tmp_path / LAYOUT.events_file("coord")).read_bytes(), EventRecord)
    (finish,) = [e for e in coord_events if e.event == "experiment_finished"]
    assert finish.data["reason"] == "interval" and "missing ['ghost']" in finish.message
    assert elapsed < 15


class _KilledCoordinatorNode(Node):
    """A coordinator whose stop is a kill: it writes no ``stopped`` state (a process killed by the runtime or a
    power cut writes nothing), so its workers stay in the run instead of stopping with it."""

    def run(self) -> None:
        from swarm_gdrive.protocol.coordinator import Coordinator

        class Killed(Coordinator):
            def _announce_stop(self, state) -> None:
                pass

        self.code = Killed(self.config, LocalStorage(self.config.gdrive_path), self.config.node_id, self.stop).run()


def test_a_worker_gives_up_with_exit_3_when_the_experiment_is_reset_under_it(tmp_path):
    """The coordinator dies (no ``stopped`` written) and is started again with RESET_EXPERIMENT=true: the worker
    still in the old run sees another run_id and exits 3. (A coordinator stopped on request stops its workers
    first, with exit 0: tests/integration/test_stop.py.)"""
    env = env_for(tmp_path, MAX_ROUNDS=3, MIN_WORKERS=2)
    old = _KilledCoordinatorNode({**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord"})
    worker = Node({**env, "NODE_ROLE": "worker", "NODE_ID": "w1"})
    old.start()
    worker.start()
    peer = tmp_path / LAYOUT.peer_file("w1")
    deadline = time.monotonic() + 20
    while not peer.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    old.stop.set()
    old.join(20)
    new = Node({**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord", "SEED": "7", "RESET_EXPERIMENT": "true"})
    new.start()
    worker.join(20)
    new.stop.set()
    new.join(20)
    assert worker.code == 3
    assert list((tmp_path / "archives" / "inproc").glob("reset_*/peers/w1.json"))


@pytest.mark.parametrize(
    ("max_peers", "generations", "peers_read", "external_used"),
    [
        (2, 4, {1, 2}, {2}),  # the peers of the first J = 2 drawn slots with variance (7 in 8 groups have it)
        (2, 1, {2}, {0}),  # one completion per group: no variance anywhere; the draw stops at K = 2 peers
        (0, 4, {5}, {2}),  # 0: every peer is read
    ],
)
def test_sapo_max_peers_caps_the_peers_a_worker_reads(tmp_path, max_peers, generations, peers_read, external_used):
    """SAPO_MAX_PEERS = K > 0 reads only the peers the drawn (peer, group) slots land on, never more than K."""
    run_swarm(tmp_path, 6, MAX_ROUNDS=2, NUM_TRANSPLANT_TREES=2, SAPO_MAX_PEERS=max_peers, NUM_GENERATIONS=generations)
    seen_reads, seen_used = set(), set()
    for w in (f"w{i}" for i in range(1, 7)):
        metrics, _ = decode_lines((tmp_path / LAYOUT.metrics_file(w)).read_bytes(), MetricRecord)
        stages = [m.values for m in metrics if "swarm/peers_read" in m.values]
        assert len(stages) == 2
        seen_reads |= {v["swarm/peers_read"] for v in stages}
        seen_used |= {v["swarm/external_used"] for v in stages}
    assert seen_reads and seen_reads <= peers_read and seen_used == external_used, (seen_reads, seen_used)


class _EvaluatingNode(Node):
    """A node whose synthetic workload also reports a held-out result, so the worker writes eval records."""

    def make_workload(self):
        from swarm_gdrive.protocol.records import TaskEval
        from swarm_gdrive.protocol.workload import SyntheticWorkload

        class Evaluating(SyntheticWorkload):
            def evaluate(self, round_: int) -> list[TaskEval]:
                return [TaskEval(task="synthetic", n=4, pass1=0.5, mean_score=0.5)]

        return Evaluating(self.config.num_train_samples, self.config.num_generations, 0.01, self.stop)


@pytest.mark.parametrize(
    ("extra", "rounds"),
    [
        ({}, ["round_0", "round_2", "round_4"]),  # the default: the baseline before round 0
        ({"EVAL_BEFORE_TRAINING": "false"}, ["round_2", "round_4"]),
        ({"TEST_MODE": "true"}, ["round_2", "round_4"]),  # the quick check starts at once (MAX_ROUNDS set: 4)
    ],
)
def test_the_evaluation_before_round_0_is_skipped_with_eval_before_training_false_and_in_test_mode(
    tmp_path, extra, rounds
):
    folder = tmp_path / "drive"
    folder.mkdir()
    env = env_for(folder, **{"MIN_WORKERS": 1, "MAX_ROUNDS": 4, "EVAL_INTERVAL": 2, **extra})
    nodes = [Node({**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord"})]
    nodes.append(_EvaluatingNode({**env, "NODE_ROLE": "worker", "NODE_ID": "w1"}))
    for node in nodes:
        node.start()
    for node in nodes:
        node.join(60)
    assert [node.code for node in nodes] == [0, 0]
    written = sorted(p.parent.name for p in (folder / LAYOUT.evals_dir).glob("round_*/w1.json"))
    assert written == rounds  # every EVAL_INTERVAL rounds and after the last (3) either way
    metrics, _ = decode_lines((folder / LAYOUT.metrics_file("w1")).read_bytes(), MetricRecord)
    assert sorted(m.round for m in metrics if "eval/pass1" in m.values) == [int(r[6:]) for r in rounds]
