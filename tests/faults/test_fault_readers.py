"""Every reader of the shared folder against what a hostile or broken folder holds (issue 14, the readers' side):
the 5 KB file with an integer of 5,000 digits in every kind of file and log line, type confusion (a folder
where a file belongs, a file or FIFO where a folder belongs) under the readers, the cleanup and the
coordinator's pruning, rollout files of names that never registered, more rollouts than a stage may read, a
node's rollout file holding another node's batch (names that collide by case), and metric lines of
distinct keys for the monitor's memory. Nodes and commands survive with their usual exit codes, and say what
they rejected (``file_rejected`` events, the monitor's ``unreadable`` finding)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from caseless import CaselessStorage
from faultkit import (
    LAYOUT,
    Swarm,
    assert_swarm_finished,
    coordinator_key_from_env,
    events,
    metrics,
    plant_state_until_rejected,
    read_record,
    rejections,
    rewards_present,
    swarm_env,
    wait_until,
)
from hostile import HUGE_REASON, flood_batch, huge_int, plant, stopped_worker
from swarm_threads import Node, fast_env

from swarm_gdrive.protocol import gather as gather_module
from swarm_gdrive.protocol.exchange import Exchange
from swarm_gdrive.protocol.gather import PeerGather
from swarm_gdrive.protocol.polling import Backoff
from swarm_gdrive.protocol.records import ExperimentRecord, RewardRecord, StateRecord, encode
from swarm_gdrive.protocol.workload import StageContext
from swarm_gdrive.storage import LocalStorage

ROUNDS = 3
WORKERS = ["w1", "w2", "w3"]


# -- a running swarm ---------------------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.slow
def test_huge_integers_type_confusion_and_unregistered_rollouts_crash_no_node(tmp_path):
    folder = tmp_path / "drive"
    folder.mkdir()
    env = swarm_env(
        folder,
        MAX_ROUNDS=ROUNDS,
        MIN_WORKERS=3,
        NUM_TRANSPLANT_TREES=2,
        ROLLOUT_CLEANUP_ENABLED="true",
        ROLLOUT_KEEP_LAST_N_ROUNDS=1,
    )
    swarm = Swarm(folder, env, WORKERS)
    try:
        swarm.start("coord")
        wait_until((folder / LAYOUT.experiment_file).exists, 60, "experiment.json", swarm.procs)
        run_id = read_record(folder, LAYOUT.experiment_file, ExperimentRecord).run_id

        for node in ("evil", "evil2"):  # registered workers: their files are read
            plant(folder, LAYOUT.peer_file(node), encode(stopped_worker(node, run_id)))
        for_all = {plant(folder, LAYOUT.peer_file("bigint"), huge_int("peer")): HUGE_REASON}
        for_coord = {plant(folder, LAYOUT.peer_file("dirpeer"), directory=True): "a folder, not a regular file"}
        for_workers = {}
        for round_ in range(ROUNDS):
            for_coord[plant(folder, LAYOUT.reward_file(round_, 0, "evil"), huge_int("reward"))] = HUGE_REASON
            for_workers[plant(folder, LAYOUT.rollout_file(round_, 0, "evil"), huge_int("rollouts"))] = HUGE_REASON
            unreg = flood_batch("unreg", run_id, round_, 1, 2, 2)  # a valid batch of a name that never registered
            plant(folder, LAYOUT.rollout_file(round_, 0, "unreg"), encode(unreg))
        for_workers[plant(folder, LAYOUT.rollout_file(1, 0, "evil2"), directory=True)] = "a folder, not a regular file"
        # 20 batches of 2 MiB under names that never registered: never read
        filler = "x" * 16_000
        for i in range(20):
            batch = flood_batch(f"stranger{i}", run_id, 0, 1, 64, 2).model_dump(mode="json")
            for group in batch["groups"]:
                group["completions"] = [filler, filler]
            plant(folder, LAYOUT.rollout_file(0, 0, f"stranger{i}"), json.dumps(batch).encode())
        # Where the coordinator prunes emptied round folders: a file and a FIFO named like stage folders.
        not_a_folder = "not a folder"
        for_coord[plant(folder, f"{LAYOUT.rollouts_round_dir(0)}/stage_7", b"x")] = not_a_folder
        for_coord[plant(folder, f"{LAYOUT.rollouts_round_dir(1)}/stage_5", fifo=True)] = not_a_folder

        w1, w2 = swarm.start("w1"), swarm.start("w2")
        wait_until(lambda: all((folder / LAYOUT.peer_file(w)).exists() for w in ("w1", "w2")), 60, "joins", swarm.procs)
        plant_state_until_rejected(folder, huge_int("state"), HUGE_REASON, [w1, w2], swarm.procs)  # round 0 waits
        swarm.start("w3")
        codes = swarm.wait(timeout=180)

        # The state file itself unreadable when the coordinator restarts: it recovers the round, no crash loop.
        plant(folder, LAYOUT.state_file, huge_int("state"))
        again = swarm.start("coord#2", node="coord")
        again_code = again.wait(timeout=60)
    finally:
        swarm.stop()

    assert codes == {"coord": 0, "w1": 0, "w2": 0, "w3": 0}, swarm.tails()
    assert again_code == 0, swarm.tails()
    state = assert_swarm_finished(folder, ROUNDS)
    recovered = [e for e in events(folder, "coord") if e.event == "state_recovered"]
    assert len(recovered) == 1 and HUGE_REASON in recovered[0].message and state.round == ROUNDS, recovered
    for w in WORKERS:  # every reward is there (the rollouts of old rounds were cleaned up, as configured)
        assert sorted(rewards_present(folder, w)) == list(range(ROUNDS)), w

    for node, expected in [("coord", {**for_all, **for_coord}), *((w, {**for_all, **for_workers}) for w in WORKERS)]:
        got = rejections(folder, node)
        for path, reason in expected.items():
            assert reason in got.get(path, ""), (node, path, got.get(path))
    for w in WORKERS:
        if w != "w3":  # w3 joined later: the coordinator had written its own state over the planted one by then
            assert HUGE_REASON in rejections(folder, w)[LAYOUT.state_file]
        ignored = [e for e in events(folder, w) if e.event == "rollouts_ignored"]
        assert [e.round for e in ignored] == list(range(ROUNDS)), ignored
        assert ignored[0].data["count"] == 21 and "stranger0" in ignored[0].data["names"], ignored[0].data
        assert all(e.data["count"] == 1 and e.data["names"] == ["unreg"] for e in ignored[1:]), ignored
        read = [m.values["storage/bytes_read"] for m in metrics(folder, w) if "storage/bytes_read" in m.values]
        assert read[0] < 1 << 20, read  # round 0: not the 40 MiB of the strangers' batches
    # Pruning went around what it may not remove, which is still there.
    assert (folder / LAYOUT.rollouts_round_dir(0) / "stage_7").is_file()
    assert (folder / LAYOUT.rollouts_round_dir(1) / "stage_5").exists()


@pytest.mark.parametrize("planted", ["huge_int", "another_run", "beyond_max_rounds", "rounds_ahead"])
def test_a_coordinator_restarted_on_an_unreadable_state_mid_run_resumes_after_the_last_rewarded_round(
    tmp_path, planted
):
    """Round 2 was being played (rewards of rounds 0 and 1 are in the folder) when the state became the 5 KB
    file, or a valid state of another run than experiment.json's (a forged one; seen in the randomised mixed run,
    where the restarted coordinator exited 2 and its workers 3): the coordinator reopens round 2 instead of exiting
    at every restart, or starting again at 0."""
    folder = tmp_path / "drive"
    folder.mkdir()
    env = fast_env(folder, LAYOUT.experiment, MAX_ROUNDS=5, NUM_TRANSPLANT_TREES=0)
    first = Node({**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord"})
    first.start()
    wait_until((folder / LAYOUT.state_file).exists, 30, "the state", [])
    first.stop.set()
    first.join(30)
    run_id = read_record(folder, LAYOUT.experiment_file, ExperimentRecord).run_id
    for round_ in (0, 1):
        reward = RewardRecord(
            node_id="w1",
            run_id=run_id,
            round=round_,
            stage=0,
            reward=1.0,
            num_local_groups=1,
            num_external_groups=0,
            external_requested=0,
            submitted_at=time.time(),
        )
        LocalStorage(folder).write_bytes(LAYOUT.reward_file(round_, 0, "w1"), encode(reward))
    if planted == "huge_int":
        (folder / LAYOUT.state_file).write_bytes(huge_int("state"))
        reason = HUGE_REASON
    else:
        state = read_record(folder, LAYOUT.state_file, StateRecord)
        change, reason = {
            "another_run": ({"run_id": "0123456789abcdef", "round": 3}, "of another run"),
            "beyond_max_rounds": ({"round": 999, "max_rounds": 1000}, "round 999, beyond MAX_ROUNDS=5"),
            "rounds_ahead": ({"round": 4}, "round 4, more than one past the last round with rewards (1)"),
        }[planted]
        forged = state.model_copy(update={**change, "status": "running", "seq": state.seq + 5})
        if planted != "another_run":  # signed by the coordinator's own key (a copy of its own put back, say): the
            # round bounds reject it, not the signature, which would reject any other forgery first
            forged = coordinator_key_from_env(env).sign(forged)
        (folder / LAYOUT.state_file).write_bytes(encode(forged))

    again = Node({**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord"})
    again.start()
    wait_until(lambda: b'"round":2' in (folder / LAYOUT.state_file).read_bytes(), 30, "the recovered state", [])
    state = read_record(folder, LAYOUT.state_file, StateRecord)
    assert (state.round, state.status, state.run_id) == (2, "running", run_id)
    again.stop.set()
    again.join(30)
    assert again.code == 0
    state = read_record(folder, LAYOUT.state_file, StateRecord)  # a stopped coordinator says so, at its round
    assert (state.round, state.status, state.run_id) == (2, "stopped", run_id)
    said = [e.message for e in events(folder, "coord") if e.event == "state_recovered"]
    assert said and reason in said[0] and "resuming at round 2 (running), after round 1" in said[0], said


@pytest.mark.parametrize("planted", ["folder", "garbage", "another_coordinator"])
def test_a_running_coordinator_writes_its_state_again_when_something_else_is_there(tmp_path, planted):
    """Round 0 waits for workers, so the coordinator has no round to open: before, a folder or garbage planted where
    the state file belongs stayed until the next round (a restarted worker gave up waiting for a readable state:
    trials 131 and 142 of the mixed run). Now it is replaced within a heartbeat interval, with seq + 1."""
    folder = tmp_path / "drive"
    folder.mkdir()
    env = fast_env(folder, LAYOUT.experiment, MAX_ROUNDS=3, MIN_WORKERS=2)
    coordinator = Node({**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord"})
    coordinator.start()
    try:
        state_file = folder / LAYOUT.state_file
        wait_until(state_file.exists, 30, "the state", [])
        honest = read_record(folder, LAYOUT.state_file, StateRecord)
        if planted == "folder":
            os.replace(state_file, tmp_path / "aside.json")
            (state_file / "inner").mkdir(parents=True)
        elif planted == "garbage":
            plant(folder, LAYOUT.state_file, b"{not json")
        else:
            other = honest.model_copy(update={"coordinator_id": "mallory", "seq": honest.seq + 7})
            plant(folder, LAYOUT.state_file, encode(other))

        def restored() -> bool:
            try:
                state = read_record(folder, LAYOUT.state_file, StateRecord)
            except (OSError, ValueError):
                return False
            return state.coordinator_id == "coord" and state.seq > honest.seq

        wait_until(restored, 30, "the coordinator's state again", [])
        state = read_record(folder, LAYOUT.state_file, StateRecord)
        assert (state.round, state.status, state.run_id) == (honest.round, honest.status, honest.run_id)
    finally:
        coordinator.stop.set()
        coordinator.join(30)
    assert coordinator.code == 0
    state = read_record(folder, LAYOUT.state_file, StateRecord)  # a stopped coordinator says so, at its round
    assert (state.round, state.status, state.run_id) == (honest.round, "stopped", honest.run_id)
    said = [e.message for e in events(folder, "coord") if e.event == "state_restored"]
    assert said and "was not this coordinator's" in said[0], said


# -- the gather --------------------------------------------------------------------------------------------------


def _gather(folder: Path, live: list[str], max_peers: int = 0) -> tuple[PeerGather, list[tuple]]:
    exchange = Exchange(LocalStorage(folder), LAYOUT, "w1", run_id="0123456789abcdef")
    said: list[tuple] = []
    ctx = StageContext("w1", 0, 0, 7)
    gather = PeerGather(
        exchange, ctx, live, max_peers, 2, lambda _ctx, g: tuple(g.rewards), lambda *a, **k: said.append((a, k))
    )
    return gather, said


def _publish(folder: Path, node: str, groups: int, completion_chars: int = 1, register: bool = True) -> None:
    run_id = "0123456789abcdef"
    batch = flood_batch(node, run_id, 0, 1, groups, 2).model_dump(mode="json")
    for group in batch["groups"]:
        group["completions"] = ["x" * completion_chars, "y" * completion_chars]
        group["rewards"] = [1.0, 0.0]
    plant(folder, LAYOUT.rollout_file(0, 0, node), json.dumps(batch).encode())
    if register:
        plant(folder, LAYOUT.peer_file(node), encode(stopped_worker(node, run_id)))


def test_a_gather_reads_only_registered_workers_and_at_most_its_budget(tmp_path, monkeypatch):
    folder = tmp_path / "drive"
    _publish(folder, "w2", 2)  # live
    _publish(folder, "w3", 2)  # registered, not in the state yet
    for i in range(5):
        _publish(folder, f"ghost{i}", 2, register=False)
    gather, said = _gather(folder, ["w1", "w2"])
    got = gather.run(threading.Event(), 5, Backoff(0.01, 0.02))
    assert sorted(got.batches) == ["w2", "w3"]
    ignored = [k for a, k in said if a[0] == "rollouts_ignored"]
    assert len(ignored) == 1 and ignored[0]["count"] == 5 and ignored[0]["names"][0] == "ghost0", said
    assert gather.exchange.stats["reads"] == 2 + 2  # two batches and the two peer files read to learn who registered

    # More bytes than a stage may read: the live peers first, then nothing more, and it says so.
    monkeypatch.setattr(gather_module, "MAX_GATHER_BYTES", 300_000)
    for node in ("a1", "a2", "a3"):
        _publish(folder, node, 8, completion_chars=10_000)  # about 160 kB each, registered
    gather, said = _gather(folder, ["w1", "w2", "a3"])
    got = gather.run(threading.Event(), 5, Backoff(0.01, 0.02))
    assert gather.exchange.stats["bytes_read"] <= 300_000 + 200_000  # a file is read whole once begun
    assert {"w2", "a3"} <= set(got.batches) and len(got.batches) < 5, sorted(got.batches)
    spent = [k for a, k in said if a[0] == "gather_budget_spent"]
    assert len(spent) == 1 and spent[0]["count"] >= 1, said

    monkeypatch.setattr(gather_module, "MAX_GATHER_FILES", 2)  # and at most this many files
    monkeypatch.setattr(gather_module, "MAX_GATHER_BYTES", 10**9)
    gather, said = _gather(folder, ["w1", "w2", "w3", "a1", "a2", "a3"])
    got = gather.run(threading.Event(), 5, Backoff(0.01, 0.02))
    assert len(got.batches) == 2 and any(a[0] == "gather_budget_spent" for a, _ in said)


# -- housekeeping ------------------------------------------------------------------------------------------------


def _batch(node: str, round_: int, run_id: str = "0123456789abcdef") -> bytes:
    return encode(flood_batch(node, run_id, round_, 1, 1, 2).model_copy(update={"node_id": node}))


def test_cleanup_deletes_only_this_nodes_batches_even_when_names_collide_by_case(tmp_path):
    storage = CaselessStorage(tmp_path)  # Drive for desktop on macOS or Windows: w1.json and W1.json are one file
    stage = LAYOUT.rollouts_stage_dir(0, 0)
    storage.write_bytes(f"{stage}/w1.json", _batch("w1", 0))
    storage.write_bytes(f"{stage}/W1.json", _batch("W1", 0))  # W1 overwrites it; the listing still says w1.json
    storage.write_bytes(LAYOUT.rollout_file(1, 0, "w1"), _batch("w1", 1))
    assert [i.name for i in storage.list(stage)] == ["w1.json"]
    rejected: dict[str, str] = {}
    exchange = Exchange(storage, LAYOUT, "w1", run_id="0123456789abcdef", on_reject=rejected.__setitem__)

    assert exchange.cleanup_rollouts(current_round=2, keep_last=1, archive=False) == 1
    assert b'"node_id":"W1"' in storage.read_bytes(f"{stage}/w1.json")  # W1's batch is still there
    assert not storage.list(LAYOUT.rollouts_stage_dir(1, 0))  # w1's own batch of round 1 is gone
    assert "node_id 'W1' inside does not match the file name" in rejected[LAYOUT.rollout_file(0, 0, "w1")]


def test_cleanup_pruning_and_readers_skip_type_confusion_and_say_so(tmp_path, caplog):
    folder = tmp_path
    storage = LocalStorage(folder, retry_attempts=2, retry_max_wait=0.01)
    run_id = "0123456789abcdef"
    for round_ in (0, 1, 2):
        storage.write_bytes(LAYOUT.rollout_file(round_, 0, "w1"), _batch("w1", round_))
    plant(folder, LAYOUT.rollout_file(0, 1, "w1"), directory=True)  # a folder where its own file belongs
    plant(folder, f"{LAYOUT.rollouts_dir}/round_1x", b"")  # not a round name: ignored
    plant(folder, LAYOUT.rollouts_round_dir(3), b"x")  # a file where a round folder belongs
    plant(folder, f"{LAYOUT.rollouts_round_dir(0)}/stage_9", fifo=True)
    plant(folder, f"{LAYOUT.archive_root}/rollouts/round_1", b"x")  # in the way of archiving round 1: cleared
    plant(folder, f"{LAYOUT.peers_dir}/.w1.json.0123456789ab.tmp", directory=True)  # a temporary's name, a folder
    plant(folder, LAYOUT.state_dir, b"x")  # a file where the state folder belongs
    plant(folder, LAYOUT.experiment_file, directory=True)
    rejected: dict[str, str] = {}
    exchange = Exchange(storage, LAYOUT, "w1", run_id=run_id, on_reject=rejected.__setitem__)

    assert exchange.read_experiment() is None and exchange.read_state() is None
    assert exchange.remove_own_temporaries([LAYOUT.peer_file("w1")]) == 0
    # rounds 0 and 1 archived: the file in the way of the node's own archive path is removed (storage/local.py)
    assert exchange.cleanup_rollouts(current_round=2, keep_last=1, archive=True) == 2
    assert (folder / LAYOUT.archived_rollout_file(0, 0, "w1")).is_file()
    assert (folder / LAYOUT.archived_rollout_file(1, 0, "w1")).is_file()
    assert not (folder / LAYOUT.rollout_file(1, 0, "w1")).exists()
    # round 0's emptied stage_0 (its stage_1 holds the planted folder, its stage_9 is a FIFO), round 1's stage_0
    # and then round_1 itself
    assert exchange.remove_empty_rollout_dirs(before_round=3) == 3
    not_a_folder = "not a folder (a file, FIFO, device or link where a folder belongs)"
    assert rejected == {
        LAYOUT.experiment_file: "a folder, not a regular file",
        LAYOUT.rollouts_round_dir(3): not_a_folder,
        LAYOUT.rollout_file(0, 1, "w1"): "a folder, not a regular file",
        f"{LAYOUT.rollouts_round_dir(0)}/stage_9": not_a_folder,
    }
    # the state under a file where the state folder belongs: the local backend reads nothing under it and says so
    assert any(f"{LAYOUT.state_dir} is a file where a folder belongs" in r.getMessage() for r in caplog.records)
    assert exchange.cleanup_rollouts(current_round=2, keep_last=1, archive=True) == 0  # tried again, said once
