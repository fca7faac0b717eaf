"""Hostile or broken files from a peer, planted in the shared folder of a running swarm of real processes:
truncated JSON, invalid UTF-8, 1 GiB files, wrong schemas, a group of 10,000 completions, 10,000 completions
in 200 groups, forged questions, provenance and rewards, a node id that is a path, files posing as the
coordinator's state or as a second coordinator, an unregistered node's rewards, a link to a folder, a FIFO,
and the state file itself overwritten with garbage. In both round modes: in the asynchronous one (ROUND_MODE=async,
GDRIVE_IMPLEMENTATION.md §5.10) the hostile names pose as live workers, so that every pickup reads their files."""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from pathlib import Path

import pytest
from faultkit import (
    LAYOUT,
    Swarm,
    Watcher,
    assert_every_round_submitted,
    assert_swarm_finished,
    coordinator_key,
    events,
    faults,
    leftovers,
    metrics,
    plant_state_until_rejected,
    played_rounds,
    read_record,
    rejections,
    swarm_env,
    wait_until,
)
from hostile import (
    FORGED_PROVENANCE,
    FORGED_QUESTION,
    FORGED_REWARDS,
    alive_worker,
    plant,
    plant_for_coordinator,
    plant_rollouts,
)

from swarm_gdrive.protocol.records import ExperimentRecord, StateRecord, encode
from swarm_gdrive.protocol.workload import SyntheticWorkload

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WORKERS = ["w1", "w2", "w3"]
ROUNDS = 3
SEED = 42
#: The async pickup's J: more than the two honest peers' and the forger's useful groups, so it reads every live peer.
ASYNC_J = 8
#: The names of plant_rollouts' hostile batches, which pose as live workers in the async run.
POSERS = ["badutf", "fifo", "flood", "forger", "huge", "linkdir", "many", "pathy", "schema", "stately", "trunc"]


def every_file(folder: Path) -> set[str]:
    """Every name under the experiment that is not a real folder (files, FIFOs, links to folders)."""
    out = set()
    for d, dirs, files in os.walk(folder / LAYOUT.root):
        out.update(str((Path(d) / f).relative_to(folder)) for f in files + [x for x in dirs if Path(d, x).is_symlink()])
    return out


class Posing(threading.Thread):
    """Rewrites the hostile names' peer files as live workers at the last round (each time a new heartbeat, so they
    stay live), until told to stop; then writes them ``stopped``, so that the coordinator may finish the run."""

    def __init__(self, folder: Path, run_id: str, names: list[str]) -> None:
        super().__init__(daemon=True)
        self.folder, self.run_id, self.names = folder, run_id, names
        self.halt = threading.Event()

    def run(self) -> None:
        beat = 1
        while not self.halt.is_set():
            for name in self.names:
                plant(self.folder, LAYOUT.peer_file(name), encode(alive_worker(name, self.run_id, ROUNDS - 1, beat)))
            beat += 1
            self.halt.wait(0.5)

    def end(self) -> None:
        self.halt.set()
        self.join(timeout=10)
        for name in self.names:
            record = alive_worker(name, self.run_id, ROUNDS - 1, 10**6).model_copy(update={"status": "stopped"})
            plant(self.folder, LAYOUT.peer_file(name), encode(record))


@pytest.mark.parametrize("round_mode", ["sync", "async"])
def test_hostile_files_are_rejected_with_their_reasons_and_nothing_forged_is_trained_on(tmp_path, round_mode):
    folder = tmp_path / "drive"
    folder.mkdir()
    spy = tmp_path / "spy"
    # Async: J more than the honest groups and no cap on the peers visited, so that every pickup reads every live
    # peer, hostile ones included.
    j, peers = (2, 8) if round_mode == "sync" else (ASYNC_J, 0)
    env = swarm_env(folder, MAX_ROUNDS=ROUNDS, MIN_WORKERS=3, NUM_TRANSPLANT_TREES=j, SAPO_MAX_PEERS=peers, SEED=SEED)
    swarm = Swarm(folder, env, WORKERS, {w: faults(spy=str(spy / w)) for w in WORKERS}, round_mode=round_mode)
    planted: set[str] = set()
    watcher = Watcher(folder, planted)
    posing: Posing | None = None
    try:
        swarm.start("coord")
        experiment = folder / LAYOUT.experiment_file
        wait_until(experiment.exists, 60, "experiment.json", swarm.procs)
        run_id = read_record(folder, LAYOUT.experiment_file, ExperimentRecord).run_id
        for_workers = {}
        for round_ in range(ROUNDS):
            for_workers.update(plant_rollouts(folder, LAYOUT, run_id, round_, SEED))
        for_coordinator = plant_for_coordinator(folder, LAYOUT, run_id, ROUNDS)
        own = {LAYOUT.experiment_file, LAYOUT.state_file, LAYOUT.peer_file("coord")}
        planted.update(every_file(folder) - own)
        watcher.start()

        # Two workers join; while the swarm waits for the third, the state file is overwritten with garbage.
        w1, w2 = swarm.start("w1"), swarm.start("w2")
        wait_until(lambda: all((folder / LAYOUT.peer_file(w)).exists() for w in ("w1", "w2")), 60, "joins", swarm.procs)
        planted.add(LAYOUT.state_file)
        garbage = b'{"kind": "state", "round": 7, "status": "fin'
        plant_state_until_rejected(folder, garbage, "not JSON", [w1, w2], swarm.procs)
        # Then the coordinator's own state, switched to the other round mode: never played, so no planted state
        # can move a run's workers into the other mode.
        other = "sync" if round_mode == "async" else "async"
        wait_until(lambda: _readable_state(folder), 30, "the coordinator's state back", swarm.procs)
        real = read_record(folder, LAYOUT.state_file, StateRecord)
        # signed by the coordinator's key, so that the mode, not the signature, is what rejects it
        switched = real.model_copy(update={"mode": other, "seq": real.seq + 1, "signature": None})
        switched = encode(coordinator_key(swarm).sign(switched))
        why = f"mode {other} is not experiment.json's ({round_mode})"
        plant_state_until_rejected(folder, switched, why, [w1, w2], swarm.procs)
        if round_mode == "async":  # live "workers" from now on: the coordinator opens the run without waiting for w3
            posing = Posing(folder, run_id, POSERS)
            posing.start()
        swarm.start("w3")  # the coordinator has written its own state over the garbage (state_restored), opens round 0
        wait_until(lambda: b'"status":"running"' in (folder / LAYOUT.state_file).read_bytes(), 60, "round 0", [])
        planted.discard(LAYOUT.state_file)
        if posing is not None:
            last = [folder / LAYOUT.reward_file(ROUNDS - 1, 0, w) for w in WORKERS]
            wait_until(lambda: all(p.exists() for p in last), 120, "every worker's last round", swarm.procs)
            posing.end()  # the posers stop: they no longer hold the end of the run
        codes = swarm.wait(timeout=180)
    finally:
        if posing is not None:
            posing.halt.set()
        swarm.stop()
        watcher.stop()

    # The swarm went on as if nothing had been planted.
    assert codes == {"coord": 0, "w1": 0, "w2": 0, "w3": 0}, swarm.tails()
    watcher.assert_clean()
    assert_swarm_finished(folder, ROUNDS, round_mode)
    assert not leftovers(folder), leftovers(folder)
    for w in WORKERS:
        assert_every_round_submitted(folder, w, range(ROUNDS))
        assert played_rounds(folder, w) == list(range(ROUNDS)), w

    # Every hostile file was rejected by every reader, with its reason, once.
    for_workers, for_coordinator = _read_in(round_mode, for_workers, for_coordinator)
    for node, expected in [*((w, for_workers) for w in WORKERS), ("coord", for_coordinator)]:
        got = rejections(folder, node)
        for path, reason in expected.items():
            assert reason in got.get(path, ""), (node, path, got.get(path))
        counts = Counter(e.data["path"] for e in events(folder, node) if e.event == "file_rejected")
        counts.pop(LAYOUT.state_file, None)  # two plants there, each said once (below)
        assert max(counts.values()) == 1, (node, counts.most_common(3))
    for w in WORKERS:
        if w != "w3":  # w3 joined later: the coordinator had written its own state over the planted one by then
            said = [e.message for e in events(folder, w) if e.event == "file_rejected" and "current_state" in e.message]
            assert "not JSON" in said[0] and "is not experiment.json's" in said[1], said
        ignored = [e.data["names"] for e in events(folder, w) if e.event == "rollouts_ignored"]
        # A valid batch of a name that never registered: unread (a pickup reads live workers' files only, by name).
        assert ignored == ([["stranger"]] * ROUNDS if round_mode == "sync" else []), ignored
    assert not rejections(folder, "coord").keys() & {LAYOUT.peer_file("fakecoord")}  # valid, just not a worker

    _assert_only_real_workers_counted(folder, round_mode)
    _assert_only_verified_groups_trained(spy, 2 if round_mode == "sync" else None)
    _assert_forged_groups_dropped(folder, round_mode)


def _readable_state(folder: Path) -> bool:
    try:
        read_record(folder, LAYOUT.state_file, StateRecord)
    except (OSError, ValueError):  # the garbage planted before, still there until the coordinator writes again
        return False
    return True


def _read_in(round_mode: str, for_workers: dict[str, str], for_coordinator: dict[str, str]):
    """The planted files each reader reads in ``round_mode``: all of them in sync; in async, a pickup reads a live
    peer's batch of its round (ROUNDS - 1), else the one before, and the coordinator the last round's rewards."""
    if round_mode == "sync":
        return for_workers, for_coordinator
    last = LAYOUT.reward_file(ROUNDS - 1, 0, "stately")
    return (
        {p: r for p, r in for_workers.items() if _round_of(p) >= ROUNDS - 2},
        {p: r for p, r in for_coordinator.items() if "/rewards/" not in p or p == last},
    )


def _assert_only_real_workers_counted(folder: Path, round_mode: str) -> None:
    """Neither the second "coordinator" nor the unregistered "ghost" with its rewards ever counted."""
    coordinator = events(folder, "coord")
    advanced = [e for e in coordinator if e.event in ("round_advanced", "experiment_finished")]
    if round_mode == "sync":
        assert [(e.data["reason"], e.data["live"], e.data["submitted"]) for e in advanced] == [
            ("all_submitted", 3, 3)
        ] * ROUNDS
    else:  # the posers, never done, held the end while live; only the real workers were counted done
        assert [(e.data["reason"], e.data["done"]) for e in advanced] == [("all_done", 3)], advanced
        assert sorted(e.data["node"] for e in coordinator if e.event == "worker_completed") == WORKERS


def _assert_forged_groups_dropped(folder: Path, round_mode: str) -> None:
    for w in WORKERS:
        stages = [m.values for m in metrics(folder, w) if "swarm/external_offered" in m.values]
        assert len(stages) == ROUNDS
        # Groups from the forger and from the 10,000-completion flood were re-scored locally; the flood's
        # 200 zero-variance groups were all dropped by the variance filter, the forged ones by provenance.
        dropped = {(e.round, e.data["group_id"]) for e in events(folder, w) if e.event == "group_rejected"}
        if round_mode == "sync":  # the flood's and the forger's batches of each round, read in each round
            assert all(v["swarm/external_zero_variance"] >= 200 for v in stages), stages
            assert all(v["swarm/external_dropped_invalid"] == 2 for v in stages), stages
            assert dropped == {(r, g) for r in range(ROUNDS) for g in (FORGED_QUESTION, FORGED_PROVENANCE)}
        else:
            # The forger's one batch, offered to every pickup: its two forged groups dropped (and logged) whenever
            # it is read, the first pickup included. The pickup reads each peer's newest batch first, within its
            # cap of listings a pickup, and the hostile names pose as live peers: whether it reaches the flood's
            # batch is not asserted; that nothing of it is trained on is (below).
            invalid = [v["swarm/external_dropped_invalid"] for v in stages]
            assert invalid[0] == 2 and all(n in (0, 2) for n in invalid), stages
            assert {g for _, g in dropped} == {FORGED_QUESTION, FORGED_PROVENANCE}, dropped
            assert len(dropped) == sum(invalid), (dropped, invalid)  # each drop logged once, with its round


def _round_of(rel: str) -> int:
    return int(rel.split("/round_")[1].split("/")[0])


def _assert_only_verified_groups_trained(spy: Path, j: int | None) -> None:
    """What went into every update: no forged question, no claimed reward, and nothing was unpickled. ``j``: the
    external groups each update took (None: async, up to ASYNC_J, what the pickup found)."""
    forged_rewards_trained = 0
    for w in WORKERS:
        assert not (spy / w / "unpickle.jsonl").exists(), (spy / w / "unpickle.jsonl").read_text()
        batches = [json.loads(line) for line in (spy / w / "train.jsonl").read_text().splitlines()]
        assert [b["round"] for b in batches] == list(range(ROUNDS))
        for batch in batches:
            assert {g["source"] for g in batch["local"]} == {w}
            assert len(batch["external"]) == j if j is not None else len(batch["external"]) <= ASYNC_J, batch
            for g in batch["external"]:
                prov = g["provenance"]
                question, answer = SyntheticWorkload.question(prov["seed"], prov["index"])
                assert g["question"] == question, g
                assert g["rewards"] == [SyntheticWorkload.score(c, answer) for c in g["completions"]], g
                assert g["group_id"] not in (FORGED_QUESTION, FORGED_PROVENANCE) and g["source"] != "many", g
                if g["group_id"] == FORGED_REWARDS:
                    assert g["rewards"] == [0.0, 1.0, 0.0, 0.0] and g["claimed_rewards"] != g["rewards"]
                    forged_rewards_trained += 1
    # The forger's true completions with inverted claims were chosen at least once: trained with local scores.
    assert forged_rewards_trained >= 1


def test_a_node_id_that_is_a_path_is_refused_before_anything_is_written(tmp_path):
    folder = tmp_path / "drive"
    folder.mkdir()
    swarm = Swarm(folder, swarm_env(folder), [])
    try:
        proc = swarm.start("../../x")
        code = proc.wait(timeout=60)
    finally:
        swarm.stop()
    assert code == 2 and any("NODE_ID='../../x'" in line for line in proc.lines), proc.lines[-5:]
    assert not list(folder.iterdir()) and not (tmp_path / "x").exists() and not (tmp_path.parent / "x").exists()
