"""Rival coordinators and a forged run change (issue 30, class 3): a second coordinator beside a live one refuses to
start (exit code 2) unless COORDINATOR_TAKEOVER=true, and then the first one yields (exit code 2) instead of
rewriting the state against it; two started together end with one. A participant who rewrites experiment.json and
the state with another run for a few seconds ends no worker: the coordinator writes both back, and a worker
restarted afterwards joins the real run. Nor does one whose forgery stays while the coordinator is paused, not even
for a worker restarted meanwhile: the coordinator key did not sign it (§5.5)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from faultkit import (
    LAYOUT,
    Swarm,
    assert_every_round_submitted,
    assert_swarm_finished,
    events,
    faults,
    read_record,
    rewards_present,
    swarm_env,
    wait_until,
)

from swarm_gdrive.protocol.records import ExperimentRecord, PeerRecord, RecordError, StateRecord, decode, encode
from swarm_gdrive.protocol.signing import CoordinatorKey

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROUNDS = 8
FORGED_RUN = "0123456789abcdef"


class StateWriters(threading.Thread):
    """Reads the state file every 20 ms and keeps the sequence of its writers, (coordinator_id, instance), with
    consecutive repeats collapsed: two coordinators rewriting the state over each other show as a long sequence."""

    def __init__(self, folder: Path) -> None:
        super().__init__(daemon=True)
        self.path = folder / LAYOUT.state_file
        self.halt = threading.Event()
        self.writers: list[tuple[str, str | None]] = []
        self.last_at: dict[tuple[str, str | None], float] = {}

    def run(self) -> None:
        while not self.halt.wait(0.02):
            try:
                state = decode(self.path.read_bytes(), StateRecord)
            except (OSError, RecordError):
                continue
            writer = (state.coordinator_id, state.instance)
            if not self.writers or self.writers[-1] != writer:
                self.writers.append(writer)
            self.last_at[writer] = time.monotonic()

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=5)


def running_swarm(
    tmp_path: Path, rounds: int = ROUNDS, hold: Path | None = None, **extra: object
) -> tuple[Path, Swarm, StateWriters]:
    """A coordinator and w1, w2 playing round 1 (of ``rounds``), the state's writers watched. ``hold``: w1 waits in
    round 1 (its heartbeat beating) until the test writes ``hold/released``, so the run cannot end meanwhile."""
    folder = tmp_path / "drive"
    folder.mkdir()
    env = swarm_env(folder, MAX_ROUNDS=rounds, MIN_WORKERS=2, **extra)
    park = {"point": "generate", "round": 1, "dir": str(hold), "until": "released"}
    swarm = Swarm(folder, env, ["w1", "w2"], extra={"w1": faults(park=park)} if hold is not None else {})
    writers = StateWriters(folder)
    writers.start()
    swarm.start_all()
    state = folder / LAYOUT.state_file
    wait_until(lambda: state.exists() and b'"round":1,' in state.read_bytes(), 90, "round 1", swarm.procs)
    if hold is not None:
        wait_until((hold / "parked").exists, 90, "w1 held in round 1", swarm.procs)
    return folder, swarm, writers


def second_coordinator(swarm: Swarm, **more: str):
    return swarm.start("coord2", NODE_ROLE="coordinator", ROUND_MODE="sync", RESET_EXPERIMENT="true", **more)


def error_line(proc) -> str:
    lines = [x for x in proc.lines if "error" in x.lower() and "coordinator" in x]
    assert lines, proc.lines[-20:]
    return lines[-1]


def test_a_second_coordinator_beside_a_live_one_refuses_to_start_and_the_swarm_goes_on(tmp_path):
    hold = tmp_path / "hold"  # on a loaded machine the second one's start alone can outlast the run (CI saw it)
    folder, swarm, writers = running_swarm(tmp_path, hold=hold)
    try:
        second = second_coordinator(swarm)
        code = second.wait(timeout=60)
        (hold / "released").write_text("")
        assert code == 2, second.lines[-20:]
        codes = swarm.wait(timeout=180)
    finally:
        swarm.stop()
        writers.stop()
    assert codes == {"coord": 0, "w1": 0, "w2": 0, "coord2": 2}, swarm.tails()
    line = error_line(second)
    assert "coordinator 'coord' (instance " in line and "runs this experiment" in line, line
    assert "s ago" in line and "its heartbeat in " in line, line
    assert "Stop it, or wait until it is gone" in line and "COORDINATOR_TAKEOVER=true" in line, line
    assert {c for c, _ in writers.writers} == {"coord"}, writers.writers  # coord2 wrote no state
    assert len(writers.writers) == 1, writers.writers  # one coordinator process, one instance
    assert not (folder / LAYOUT.events_file("coord2")).exists()  # nor anything else
    assert_swarm_finished(folder, ROUNDS)
    for w in ("w1", "w2"):
        assert_every_round_submitted(folder, w, range(ROUNDS))


def test_a_takeover_makes_the_running_coordinator_yield_with_no_livelock(tmp_path):
    folder, swarm, writers = running_swarm(tmp_path)
    first = swarm.procs[0]
    try:
        second_coordinator(swarm, COORDINATOR_TAKEOVER="true")
        assert first.wait(timeout=60) == 2, first.lines[-20:]
        yielded = time.monotonic()
        codes = swarm.wait(timeout=180)
    finally:
        swarm.stop()
        writers.stop()
    assert codes == {"coord": 2, "w1": 0, "w2": 0, "coord2": 0}, swarm.tails()
    line = error_line(first)
    assert "coordinator 'coord2' (instance " in line and "took over experiment 'faults'" in line, line
    # No livelock: the writers went from coord to coord2 (at most once back and forth, a write of coord's that
    # crossed coord2's first), and none of coord's states was seen after it exited.
    names = [c for c, _ in writers.writers]
    assert names[0] == "coord" and names[-1] == "coord2" and len(names) <= 4, writers.writers
    assert len(set(writers.writers)) == 2, writers.writers
    assert all(t < yielded for w, t in writers.last_at.items() if w[0] == "coord"), writers.last_at
    (overtaken,) = [e for e in events(folder, "coord") if e.event == "coordinator_overtaken"]
    assert overtaken.data["rival"] == "coord2"
    assert_swarm_finished(folder, ROUNDS)
    for w in ("w1", "w2"):
        assert_every_round_submitted(folder, w, range(ROUNDS))


def test_two_coordinators_started_together_end_with_one(tmp_path):
    folder = tmp_path / "drive"
    folder.mkdir()
    env = swarm_env(folder, MAX_ROUNDS=3, MIN_WORKERS=2)
    swarm = Swarm(folder, env, ["w1", "w2"])
    writers = StateWriters(folder)
    writers.start()
    try:
        one = swarm.start("coord")
        two = second_coordinator(swarm)
        wait_until(lambda: one.returncode is not None or two.returncode is not None, 60, "one exits", swarm.procs)
        loser, winner = (one, two) if one.returncode is not None else (two, one)
        assert loser.returncode == 2, loser.lines[-20:]
        # Workers once one is left and experiment.json names the winner's run: the loser's, still there for the
        # seconds the winner watches before it writes its own back, would be pinned by a worker joining then (that
        # worker exits 3 after COORDINATOR_WAIT_TIMEOUT, told to rejoin with REPIN_COORDINATOR_KEY=true; CI saw it
        # once). The winner may also have resumed the run the loser created (it read the loser's experiment.json
        # first): then that file is the winner's run and stays, naming the loser as its creator (CI saw it once).
        own = "coord" if winner is one else "coord2"

        def winners_run() -> bool:
            try:
                state = read_record(folder, LAYOUT.state_file, StateRecord)
                experiment = read_record(folder, LAYOUT.experiment_file, ExperimentRecord)
            except FileNotFoundError:
                return False
            return state.coordinator_id == own and state.run_id == experiment.run_id

        wait_until(winners_run, 60, "experiment.json of the winner's run", swarm.procs)
        swarm.start("w1")
        swarm.start("w2")
        codes = swarm.wait(timeout=180)
    finally:
        swarm.stop()
        writers.stop()
    assert codes == {loser.name: 2, winner.name: 0, "w1": 0, "w2": 0}, swarm.tails()
    assert error_line(loser)
    state = assert_swarm_finished(folder, 3)
    assert state.coordinator_id == ("coord" if winner is one else "coord2")
    assert len(writers.writers) <= 4, writers.writers


def plant(path: Path, data: bytes) -> None:
    tmp = path.with_name(".planted.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def plant_forged_run(folder: Path, seconds: float) -> int:
    """experiment.json and the state rewritten with another run, coordinator-consistent (the real coordinator's
    NODE_ID in both), again every 0.5 s for ``seconds``: each plant lasts until the coordinator writes its own back.
    Returns how many times the coordinator had to."""
    experiment = read_record(folder, LAYOUT.experiment_file, ExperimentRecord)
    fake_experiment = encode(experiment.model_copy(update={"run_id": FORGED_RUN}))
    end, planted = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        real = read_record(folder, LAYOUT.state_file, StateRecord)
        fake = real.model_copy(update={"run_id": FORGED_RUN, "seq": real.seq + 1})
        plant(folder / LAYOUT.experiment_file, fake_experiment)
        plant(folder / LAYOUT.state_file, encode(fake))
        planted += 1
        time.sleep(0.5)
    return planted


def test_a_forged_run_change_in_both_files_ends_no_worker_and_heals(tmp_path):
    # Rounds of about 1.5 s: the coordinator is still serving them when the forgery ends, and w3 joins in time.
    folder, swarm, writers = running_swarm(tmp_path, 12, SYNTHETIC_STEP_SECONDS=1.5)
    try:
        plant_forged_run(folder, 6.0)  # longer than a worker's window (2.6 s): the coordinator's reverts hold
        assert read_record(folder, LAYOUT.state_file, StateRecord).round < 10, "the forgery came too late"
        wait_until(
            lambda: read_record(folder, LAYOUT.experiment_file, ExperimentRecord).run_id != FORGED_RUN,
            30,
            "experiment.json written back",
            swarm.procs,
        )
        assert all(p.returncode is None for p in swarm.procs), swarm.tails()
        late = swarm.start("w3")  # a worker (re)started after the forgery joins the real run
        codes = swarm.wait(timeout=180)
    finally:
        swarm.stop()
        writers.stop()
    assert codes == {"coord": 0, "w1": 0, "w2": 0, "w3": 0}, swarm.tails()
    state = assert_swarm_finished(folder, 12)
    for w in ("w1", "w2"):
        assert_every_round_submitted(folder, w, range(12))
        assert not [e for e in events(folder, w) if e.event == "worker_gave_up"]
    joined = rewards_present(folder, "w3")
    assert joined and {r.run_id for r in joined.values()} == {state.run_id}, (joined, late.lines[-20:])
    restored = [
        e.message for e in events(folder, "coord") if e.event == "state_restored" and "experiment.json" in e.message
    ]
    assert restored and all(f"run_id '{FORGED_RUN}'" in m for m in restored), restored


@pytest.mark.parametrize("signed_by", ["copied", "own_key"])
def test_a_forged_run_change_that_stays_ends_no_worker_and_a_worker_restarted_meanwhile_joins_the_real_run(
    tmp_path, signed_by
):
    """The coordinator paused for 8 s (a worker's run-change window is 2.6 s) with both files naming another run:
    copied from the real ones (their signatures no longer match), or signed by the forger's own key. w2 is killed and
    started again meanwhile: it waits, then joins the real run once the coordinator writes it back."""
    folder, swarm, writers = running_swarm(tmp_path, 12, SYNTHETIC_STEP_SECONDS=1.5)
    coordinator, w1, w2 = swarm.procs
    experiment = read_record(folder, LAYOUT.experiment_file, ExperimentRecord)
    mallory = CoordinatorKey.load_or_create(tmp_path / "mallory.pem")
    try:
        coordinator.proc.send_signal(signal.SIGSTOP)
        try:
            real = read_record(folder, LAYOUT.state_file, StateRecord)
            fake_experiment = experiment.model_copy(update={"run_id": FORGED_RUN})
            fake = real.model_copy(update={"run_id": FORGED_RUN, "seq": real.seq + 1})
            if signed_by == "own_key":
                fake_experiment = mallory.sign(fake_experiment.model_copy(update={"public_key": mallory.public}))
                fake = mallory.sign(fake)
            plant(folder / LAYOUT.experiment_file, encode(fake_experiment))
            plant(folder / LAYOUT.state_file, encode(fake))
            w2.kill()
            swarm.procs.remove(w2)
            again = swarm.start("w2")  # its pin (key, run) is in its node-local record
            time.sleep(8.0)
            assert w1.returncode is None and again.returncode is None, swarm.tails()
            assert read_record(folder, LAYOUT.experiment_file, ExperimentRecord).run_id == FORGED_RUN  # it stayed
        finally:
            coordinator.proc.send_signal(signal.SIGCONT)
        codes = swarm.wait(timeout=180)
    finally:
        swarm.stop()
        writers.stop()
    assert codes == {"coord": 0, "w1": 0, "w2": 0}, swarm.tails()
    state = assert_swarm_finished(folder, 12)
    assert state.run_id == experiment.run_id
    for w in ("w1", "w2"):
        assert not [e for e in events(folder, w) if e.event == "worker_gave_up"]
        assert {r.run_id for r in rewards_present(folder, w).values()} == {experiment.run_id}
    assert_every_round_submitted(folder, "w1", range(12))
    said = [e.message for e in events(folder, "w2") if e.event == "file_rejected" and "experiment.json" in e.message]
    assert said, again.lines[-20:]


def test_a_takeover_with_a_reset_starts_a_new_run_and_the_old_coordinator_yields(tmp_path):
    """COORDINATOR_TAKEOVER=true with RESET_EXPERIMENT=true and another SEED: the running experiment is archived,
    the old coordinator yields (exit 2) instead of writing its run back, its workers end as on a reset (exit 3), and
    workers started again play the new run."""
    folder, swarm, writers = running_swarm(tmp_path)
    first, old_w1, old_w2 = swarm.procs
    old_run = read_record(folder, LAYOUT.experiment_file, ExperimentRecord).run_id
    try:
        second_coordinator(swarm, COORDINATOR_TAKEOVER="true", SEED="7")
        assert first.wait(timeout=60) == 2, first.lines[-20:]
        assert old_w1.wait(timeout=60) == 3 and old_w2.wait(timeout=60) == 3, swarm.tails()
        swarm.start("w1b", node="w1", SEED="7")
        swarm.start("w2b", node="w2", SEED="7")
        codes = swarm.wait(timeout=180)
    finally:
        swarm.stop()
        writers.stop()
    assert codes == {"coord": 2, "w1": 3, "w2": 3, "coord2": 0, "w1b": 0, "w2b": 0}, swarm.tails()
    state = assert_swarm_finished(folder, ROUNDS)
    assert state.run_id != old_run and state.coordinator_id == "coord2"
    for w in ("w1", "w2"):
        assert_every_round_submitted(folder, w, range(ROUNDS))
    assert "took over experiment 'faults'" in error_line(first)
    assert list((folder / "archives").iterdir()), "the old run was not archived"


def test_a_state_in_the_name_of_a_coordinator_whose_heartbeat_is_frozen_is_overwritten(tmp_path):
    """A participant plants a coordinator's peer file (alive, never beating) and a state in its name: the running
    coordinator watches that heartbeat, finds it frozen, writes its own state again, and does not yield."""
    folder, swarm, writers = running_swarm(tmp_path)
    try:
        real = read_record(folder, LAYOUT.state_file, StateRecord)
        now = time.time()
        peer = PeerRecord(
            node_id="mallory",
            role="coordinator",
            run_id=real.run_id,
            registered_at=now,
            heartbeat=5,
            heartbeat_at=now,
            status="alive",
        )
        plant(folder / LAYOUT.peer_file("mallory"), encode(peer))
        fake = real.model_copy(update={"coordinator_id": "mallory", "seq": real.seq + 1, "instance": "ab" * 8})
        plant(folder / LAYOUT.state_file, encode(fake))
        said = "was not this coordinator's"
        wait_until(lambda: any(said in x and "'mallory'" in x for x in swarm.procs[0].lines), 60, "restored", [])
        codes = swarm.wait(timeout=180)
    finally:
        swarm.stop()
        writers.stop()
    assert codes == {"coord": 0, "w1": 0, "w2": 0}, swarm.tails()
    assert_swarm_finished(folder, ROUNDS)
    assert any("writing nothing for" in x and "'mallory'" in x for x in swarm.procs[0].lines)
    assert not [e for e in events(folder, "coord") if e.event == "coordinator_overtaken"]
