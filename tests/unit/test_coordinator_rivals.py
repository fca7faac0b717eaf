"""Two coordinators on one experiment (issue 30, class 3), on a real local folder: the state's ``instance``, the
start check against a live coordinator of another NODE_ID, the read-back of experiment.json, and the check before
each write that keeps a coordinator from writing over another's state unseen. Real processes:
tests/faults/test_fault_rivals.py."""

from __future__ import annotations

import threading
import time

import pytest

from swarm_gdrive.config import from_env
from swarm_gdrive.protocol.coordinator import Coordinator, RivalCoordinatorError
from swarm_gdrive.protocol.exchange import Exchange
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import ExperimentRecord, PeerRecord, StateRecord, decode, encode
from swarm_gdrive.storage import LocalStorage

LAYOUT = Layout("exp")


def make_config(tmp_path, **extra):
    env = {
        "GDRIVE_PATH": str(tmp_path),
        "EXPERIMENT_NAME": "exp",
        "NODE_ROLE": "coordinator",
        "SWARM_LOCAL_DIR": f"{tmp_path}-local",  # beside the shared folder, never in it
        "HEARTBEAT_INTERVAL": "0.1",
    }
    return from_env({**env, **{k: str(v) for k, v in extra.items()}})


def coordinator(tmp_path, node: str = "coord", **extra) -> Coordinator:
    return Coordinator(make_config(tmp_path, **extra), LocalStorage(tmp_path), node, threading.Event())


def peer(node: str, run_id: str, heartbeat: int) -> PeerRecord:
    return PeerRecord(
        node_id=node,
        role="coordinator",
        run_id=run_id,
        registered_at=1.0,
        heartbeat=heartbeat,
        heartbeat_at=1.0,
        status="alive",
    )


class Beating:
    """A coordinator's heartbeat: ``node``'s peer file rewritten with a rising count every 50 ms."""

    def __init__(self, tmp_path, node: str, run_id: str) -> None:
        self.exchange = Exchange(LocalStorage(tmp_path), LAYOUT, node, run_id)
        self.node, self.run_id, self.halt = node, run_id, threading.Event()
        self.exchange.write_peer(peer(node, run_id, 1))
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self) -> None:
        count = 1
        while not self.halt.wait(0.05):
            count += 1
            self.exchange.write_peer(peer(self.node, self.run_id, count))

    def __enter__(self) -> Beating:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.halt.set()
        self.thread.join()


def test_the_instance_is_left_out_of_the_json_when_unset_so_old_state_files_stay_valid(tmp_path):
    first = coordinator(tmp_path)
    written = first.open_experiment()
    data = (tmp_path / LAYOUT.state_file).read_bytes()
    assert written.instance == first.instance and f'"instance":"{first.instance}"'.encode() in data
    old = written.model_copy(update={"instance": None})
    assert b"instance" not in encode(old) and decode(encode(old), StateRecord) == old


def test_a_second_coordinator_beside_a_beating_one_refuses_before_writing_anything(tmp_path):
    first = coordinator(tmp_path)
    state = first.open_experiment()
    before = {p: p.read_bytes() for p in (tmp_path / LAYOUT.state_file, tmp_path / LAYOUT.experiment_file)}
    with Beating(tmp_path, "coord", state.run_id), pytest.raises(RivalCoordinatorError) as caught:
        coordinator(tmp_path, "coord2", RESET_EXPERIMENT="true", SEED=9).open_experiment()
    message = str(caught.value)
    assert f"coordinator 'coord' (instance {first.instance}) runs this experiment" in message, message
    assert "s ago" in message and "its heartbeat in experiments/exp/peers/coord.json went from" in message
    assert "Stop it, or wait until it is gone" in message and "COORDINATOR_TAKEOVER=true" in message
    assert before == {p: p.read_bytes() for p in before}  # the reset did not happen
    assert not (tmp_path / "archives").exists()


def test_a_reset_waits_liveness_timeout_and_refuses_when_a_killed_coordinator_comes_back(tmp_path):
    """A coordinator killed a moment ago (its heartbeat frozen past the short start watch) and restarting: a second
    coordinator with RESET_EXPERIMENT=true watches for LIVENESS_TIMEOUT before moving the run away, sees the
    restarted one register, and refuses; nothing moved (seed 33 of the async hostile trials)."""
    state = coordinator(tmp_path).open_experiment()
    Exchange(LocalStorage(tmp_path), LAYOUT, "coord", state.run_id).write_peer(peer("coord", state.run_id, 7))

    def restart() -> None:  # the harness restarts the killed node: a new registration of the same NODE_ID
        time.sleep(3.0)
        back = peer("coord", state.run_id, 1).model_copy(update={"registered_at": 2.0})
        Exchange(LocalStorage(tmp_path), LAYOUT, "coord", state.run_id).write_peer(back)

    thread = threading.Thread(target=restart, daemon=True)
    thread.start()
    with pytest.raises(RivalCoordinatorError, match="RESET_EXPERIMENT refused: coordinator 'coord' runs"):
        coordinator(tmp_path, "coord2", RESET_EXPERIMENT="true", SEED=9, LIVENESS_TIMEOUT=8).open_experiment()
    thread.join()
    assert not (tmp_path / "archives").exists()


def test_a_reset_over_a_coordinator_silent_for_liveness_timeout_goes_ahead(tmp_path):
    state = coordinator(tmp_path).open_experiment()
    Exchange(LocalStorage(tmp_path), LAYOUT, "coord", state.run_id).write_peer(peer("coord", state.run_id, 7))
    started = time.monotonic()
    fresh = coordinator(tmp_path, "coord2", RESET_EXPERIMENT="true", SEED=9, LIVENESS_TIMEOUT=4).open_experiment()
    assert time.monotonic() - started >= 4.0 and fresh.run_id != state.run_id
    assert (tmp_path / "archives").exists()


def test_a_coordinator_of_another_node_id_whose_heartbeat_is_frozen_is_resumed_from(tmp_path):
    state = coordinator(tmp_path).open_experiment()
    Exchange(LocalStorage(tmp_path), LAYOUT, "coord", state.run_id).write_peer(peer("coord", state.run_id, 7))
    started = time.monotonic()
    resumed = coordinator(tmp_path, "coord2").open_experiment()
    assert time.monotonic() - started >= 2.0  # watched for its window (at least 2 s + SYNC_LAG)
    assert (resumed.run_id, resumed.coordinator_id) == (state.run_id, "coord2")


def test_a_coordinator_restarted_with_its_node_id_resumes_without_a_watch(tmp_path):
    state = coordinator(tmp_path).open_experiment()
    with Beating(tmp_path, "coord", state.run_id):  # its own old heartbeat: the launcher's twin check owns this
        started = time.monotonic()
        again = coordinator(tmp_path)
        resumed = again.open_experiment()
    assert time.monotonic() - started < 1.5
    assert resumed.run_id == state.run_id and resumed.instance == again.instance != state.instance


def test_with_takeover_it_resumes_and_the_other_yields_once_it_reads_the_state_back(tmp_path):
    first = coordinator(tmp_path)
    state = first.open_experiment()
    with Beating(tmp_path, "coord2", state.run_id):
        with Beating(tmp_path, "coord", state.run_id):
            taker = coordinator(tmp_path, "coord2", COORDINATOR_TAKEOVER="true")
            taken = taker.open_experiment()
        assert taken.seq > state.seq and taken.instance == taker.instance
        assert not first._holds(state)  # first never writes its next state over the taker's
        with pytest.raises(RivalCoordinatorError) as caught:
            first._keep_own_state(state)
    assert f"coordinator 'coord2' (instance {taker.instance}) took over experiment 'exp'" in str(caught.value)
    assert decode((tmp_path / LAYOUT.state_file).read_bytes(), StateRecord) == taken  # not written back
    assert (tmp_path / LAYOUT.experiment_file).exists()  # the run goes on under the taker: its experiment.json stays
    # The taker writes its own over the state of the one it took over, at once (no watch: it does not yield).
    Exchange(LocalStorage(tmp_path), LAYOUT, "coord", state.run_id).write_state(state.model_copy(update={"seq": 99}))
    restored = taker._keep_own_state(taken)
    assert restored.instance == taker.instance and restored.seq == 100


def test_the_one_of_two_coordinators_started_together_that_yields_removes_its_experiment_json(tmp_path):
    """Both created a run; the state file holds the winner's, experiment.json the loser's (it wrote last). A worker
    joining before the winner writes its own back would pin the loser's key: the loser removes it as it yields, and
    the winner's next read-back writes its own."""
    loser = coordinator(tmp_path, SWARM_LOCAL_DIR=f"{tmp_path}-loser")
    loser_state = loser.open_experiment()
    winner = coordinator(tmp_path, "coord2", SWARM_LOCAL_DIR=f"{tmp_path}-winner")
    won = winner._create()  # as if it had read no experiment.json either
    loser.exchange.write_experiment(loser._experiment)  # the loser's experiment.json was written last
    with Beating(tmp_path, "coord2", won.run_id), pytest.raises(RivalCoordinatorError):
        loser._keep_own_state(loser_state)
    assert not (tmp_path / LAYOUT.experiment_file).exists()
    assert winner._keep_own_state(won) == won
    written = decode((tmp_path / LAYOUT.experiment_file).read_bytes(), ExperimentRecord)
    assert written == winner._experiment and written.public_key != loser._experiment.public_key


def test_a_forged_run_in_experiment_json_is_written_back(tmp_path):
    first = coordinator(tmp_path)
    state = first.open_experiment()
    path = tmp_path / LAYOUT.experiment_file
    real = decode(path.read_bytes(), ExperimentRecord)
    path.write_bytes(encode(real.model_copy(update={"run_id": "0123456789abcdef"})))
    assert first._keep_own_state(state) == state  # the state was its own: unchanged
    assert decode(path.read_bytes(), ExperimentRecord) == real
