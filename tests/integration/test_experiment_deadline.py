"""EXPERIMENT_DEADLINE_MINUTES ends a swarm (issue #28): the real coordinator and workers as threads on a local
folder, synthetic workload. Asynchronous: the coordinator finishes the experiment at the deadline; each worker ends
after the round it is playing, with that round's reward written and its final end of round (the checkpoint) done,
and exits 0; the coordinator's record counts every worker's rounds. Synchronous: the round open at the deadline is
played to its end, and no other opens."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import EventRecord, MetricRecord, RewardRecord, StateRecord, decode, decode_lines
from swarm_gdrive.protocol.workload import SyntheticWorkload

pytestmark = pytest.mark.integration
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from swarm_threads import Node, fast_env  # noqa: E402

LAYOUT = Layout("deadline")


class Ending(Node):
    """A worker whose stand-in workload remembers the round of its final end of round (where a real one checkpoints)."""

    final: int | None = None

    def make_workload(self) -> SyntheticWorkload:
        node = self

        class Workload(SyntheticWorkload):
            def end_round(self, round_: int, final: bool) -> dict[str, float]:
                if final:
                    node.final = round_
                return super().end_round(round_, final)

        return Workload(
            self.config.num_train_samples, self.config.num_generations, self.config.synthetic_step_seconds, self.stop
        )


def lines(folder: Path, path: str, model: type) -> list:
    found, problems = decode_lines((folder / path).read_bytes(), model)
    assert not problems
    return found


def test_past_the_deadline_an_async_swarm_finishes_and_each_worker_ends_after_its_round(tmp_path):
    # 0.1 minutes: 6 s after experiment.json (time for both workers to join on a loaded machine), short of MAX_ROUNDS
    env = fast_env(
        tmp_path,
        "deadline",
        MAX_ROUNDS=100_000,
        MIN_WORKERS=2,
        NUM_TRANSPLANT_TREES=1,
        SYNTHETIC_STEP_SECONDS=0.05,
        EXPERIMENT_DEADLINE_MINUTES=0.1,
    )
    nodes = [Node({**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord", "ROUND_MODE": "async"})]
    workers = [Ending({**env, "NODE_ROLE": "worker", "NODE_ID": w}) for w in ("w1", "w2")]
    for n in [*nodes, *workers]:
        n.start()
    for n in [*nodes, *workers]:
        n.join(20)
    assert [n.code for n in [*nodes, *workers]] == [0, 0, 0]

    state = decode((tmp_path / LAYOUT.state_file).read_bytes(), StateRecord)
    assert (state.status, state.advance_reason, state.round, state.mode) == ("finished", "deadline", 0, "async")
    played = {}
    for worker in workers:
        w = worker.config.node_id
        found = (tmp_path / LAYOUT.rewards_dir).glob(f"round_*/stage_0/{w}.json")
        played[w] = sorted(decode(p.read_bytes(), RewardRecord).round for p in found)
        assert played[w] and played[w] == list(range(len(played[w]))), (w, played[w])  # no round left unrewarded
        assert len(played[w]) < 100_000
        metrics = lines(tmp_path, LAYOUT.metrics_file(w), MetricRecord)
        assert [m.round for m in metrics if "swarm/external_used" in m.values] == played[w]  # each round whole
        assert worker.final == played[w][-1], "the final end of round (checkpoint) is of its last round"
        events = lines(tmp_path, LAYOUT.events_file(w), EventRecord)
        assert [e.event for e in events if e.event in ("experiment_finished", "rounds_completed")] == [
            "experiment_finished"
        ]
    coordinator = lines(tmp_path, LAYOUT.events_file("coord"), EventRecord)
    [finished] = [e for e in coordinator if e.event == "experiment_finished"]
    assert finished.data["reason"] == "deadline" and "EXPERIMENT_DEADLINE_MINUTES=0.1" in finished.message
    # the record of the swarm's progress counts each worker's last round, played after the state said finished
    last = [e for e in coordinator if e.event == "swarm_progress"][-1]
    assert dict(zip(last.data["nodes"], last.data["rounds_done"], strict=True)) == {
        w: len(rounds) for w, rounds in played.items()
    }
    metrics = lines(tmp_path, LAYOUT.metrics_file("coord"), MetricRecord)
    progress = [m.values for m in metrics if "swarm/rewards_counted" in m.values]
    assert progress and all(v["swarm/reward_mean"] is None or 0 <= v["swarm/reward_mean"] <= 1 for v in progress)


def test_past_the_deadline_a_sync_swarm_finishes_when_the_open_round_ends(tmp_path):
    env = fast_env(tmp_path, "deadline", MAX_ROUNDS=100_000, MIN_WORKERS=2, EXPERIMENT_DEADLINE_MINUTES=0.1)
    nodes = [Node({**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord"})]
    nodes += [Node({**env, "NODE_ROLE": "worker", "NODE_ID": w}) for w in ("w1", "w2")]
    for n in nodes:
        n.start()
    for n in nodes:
        n.join(20)
    assert [n.code for n in nodes] == [0, 0, 0]

    state = decode((tmp_path / LAYOUT.state_file).read_bytes(), StateRecord)
    assert (state.status, state.advance_reason, state.mode) == ("finished", "deadline", "sync")
    assert 0 < state.round < 100_000
    for w in ("w1", "w2"):  # every round up to the last one closed was played whole by both
        found = (tmp_path / LAYOUT.rewards_dir).glob(f"round_*/stage_0/{w}.json")
        assert sorted(decode(p.read_bytes(), RewardRecord).round for p in found) == list(range(state.round))
