"""The coordinator key (protocol/signing.py): signatures over the canonical JSON, the key file (0600, never in the
shared folder, one key for two coordinators started together), a coordinator that keeps or lacks its key, a worker's
pin, and the trust rule of a keyed experiment (protocol/trust.py) on a clock the test moves
(GDRIVE_IMPLEMENTATION.md §5.5, §13)."""

from __future__ import annotations

import json
import stat
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarm_gdrive.config import from_env
from swarm_gdrive.envparse import ConfigError
from swarm_gdrive.protocol.coordinator import Coordinator, ExperimentMismatchError
from swarm_gdrive.protocol.exchange import Exchange, RunChangedError
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import ExperimentRecord, StateRecord, decode, encode
from swarm_gdrive.protocol.signing import (
    KEY_FILE_NAME,
    CoordinatorKey,
    canonical,
    pin_of,
    pin_verdict,
    self_signed,
    signed_by,
)
from swarm_gdrive.protocol.trust import UNSIGNED_REPORT_SECONDS, StateFollower
from swarm_gdrive.storage import LocalStorage
from tests.unit.test_state_trust import OTHER, RUN, Clock, state  # the same records and clock, built one way

LAYOUT = Layout("exp")


def new_key(tmp_path: Path, name: str = "k.pem") -> CoordinatorKey:
    return CoordinatorKey.load_or_create(tmp_path / "keys" / name)


def experiment(key: CoordinatorKey | None, run: str = RUN, created_at: float = 10.0) -> ExperimentRecord:
    record = ExperimentRecord(
        experiment="exp",
        run_id=run,
        fingerprint="0" * 16,
        config={},
        coordinator_id="coord",
        created_at=created_at,
        public_key=None if key is None else key.public,
    )
    return record if key is None else key.sign(record)


# -- signatures and the key file ---------------------------------------------------------------


def test_a_signature_covers_every_other_field_and_only_its_key_verifies_it(tmp_path):
    key, other = new_key(tmp_path), new_key(tmp_path, "other.pem")
    signed = key.sign(state(3, 4))
    assert signed_by(signed, key.public) and not signed_by(signed, other.public)
    assert signed_by(decode(encode(signed), StateRecord), key.public)  # through the file's JSON and back
    assert not signed_by(state(3, 4), key.public)  # unsigned
    for change in ({"status": "finished"}, {"run_id": OTHER}, {"seq": 5}, {"live_workers": ["x"]}, {"mode": "async"}):
        assert not signed_by(signed.model_copy(update=change), key.public), change
    assert key.sign(signed) == signed  # signing again replaces the signature by the same one (Ed25519)
    assert {**json.loads(canonical(signed)), "signature": signed.signature} == json.loads(encode(signed))
    assert b" " not in canonical(signed) and b"signature" not in canonical(signed)
    assert list(json.loads(canonical(signed))) == sorted(json.loads(canonical(signed)))
    record = experiment(key)
    assert self_signed(record) and not self_signed(record.model_copy(update={"run_id": OTHER}))
    assert not self_signed(experiment(None))


def test_an_experiment_and_a_state_without_the_new_fields_stay_valid_and_their_json_unchanged():
    old = experiment(None)
    assert b"public_key" not in encode(old) and b"signature" not in encode(old)
    assert b"signature" not in encode(state(0, 0))


def test_the_key_file_is_0600_and_a_second_load_gives_the_same_key(tmp_path):
    path = tmp_path / "local" / "exp" / KEY_FILE_NAME
    key = CoordinatorKey.load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert CoordinatorKey.load(path).public == key.public
    assert CoordinatorKey.load_or_create(path).public == key.public
    assert [p.name for p in path.parent.iterdir()] == [KEY_FILE_NAME]  # no temporary left
    assert CoordinatorKey.load(tmp_path / "absent.pem") is None


def test_two_coordinators_creating_the_key_at_once_end_with_one_key(tmp_path):
    path = tmp_path / "exp" / KEY_FILE_NAME
    keys: list[str] = []
    threads = [threading.Thread(target=lambda: keys.append(CoordinatorKey.load_or_create(path).public)) for _ in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(keys)) == 1 and CoordinatorKey.load(path).public == keys[0]


def test_a_key_file_that_holds_no_key_is_refused_naming_it(tmp_path):
    path = tmp_path / KEY_FILE_NAME
    path.write_text("not a key")
    with pytest.raises(RuntimeError, match=f"{path}.*COORDINATOR_KEY_FILE"):
        CoordinatorKey.load(path)


# -- the coordinator ---------------------------------------------------------------------------


def config(tmp_path: Path, **extra):
    env = {
        "GDRIVE_PATH": str(tmp_path / "drive"),
        "EXPERIMENT_NAME": "exp",
        "NODE_ROLE": "coordinator",
        "SWARM_LOCAL_DIR": str(tmp_path / "local"),
        "COORDINATOR_ROUND_INTERVAL": "60",
    }
    (tmp_path / "drive").mkdir(exist_ok=True)
    return from_env({**env, **{k: str(v) for k, v in extra.items()}})


def open_coordinator(tmp_path: Path, **extra) -> tuple[Coordinator, StateRecord]:
    coordinator = Coordinator(config(tmp_path, **extra), LocalStorage(tmp_path / "drive"), "coord", threading.Event())
    return coordinator, coordinator.open_experiment()


def on_disk(tmp_path: Path) -> tuple[ExperimentRecord, StateRecord]:
    folder = tmp_path / "drive"
    return (
        decode((folder / LAYOUT.experiment_file).read_bytes(), ExperimentRecord),
        decode((folder / LAYOUT.state_file).read_bytes(), StateRecord),
    )


def test_the_coordinator_keeps_its_key_outside_the_shared_folder_and_signs_experiment_json_and_the_state(tmp_path):
    coordinator, _ = open_coordinator(tmp_path)
    path = tmp_path / "local" / "exp" / KEY_FILE_NAME
    assert coordinator.key.path == path and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not [p for p in (tmp_path / "drive").rglob("*") if p.suffix == ".pem" or b"PRIVATE" in _bytes(p)]
    record, current = on_disk(tmp_path)
    assert record.public_key == coordinator.key.public and self_signed(record)
    assert signed_by(current, record.public_key)


def _bytes(path: Path) -> bytes:
    return path.read_bytes() if path.is_file() else b""


def test_a_restarted_coordinator_signs_with_the_same_key(tmp_path):
    first, _ = open_coordinator(tmp_path)
    second, resumed = open_coordinator(tmp_path)
    record, current = on_disk(tmp_path)
    assert second.key.public == first.key.public == record.public_key
    assert current == resumed and signed_by(current, first.key.public) and current.seq > 0


def test_a_coordinator_without_its_key_refuses_naming_the_fix_unless_reset(tmp_path):
    first, _ = open_coordinator(tmp_path)
    old_run = on_disk(tmp_path)[0].run_id
    (tmp_path / "local" / "exp" / KEY_FILE_NAME).unlink()
    with pytest.raises(ExperimentMismatchError) as refused:
        open_coordinator(tmp_path)
    message = str(refused.value)
    assert f"no key file at {tmp_path / 'local' / 'exp' / KEY_FILE_NAME}" in message, message
    assert "COORDINATOR_KEY_FILE" in message and "RESET_EXPERIMENT=true" in message, message
    assert "REPIN_COORDINATOR_KEY=true" in message, message
    assert on_disk(tmp_path)[0].run_id == old_run  # nothing written
    reset, _ = open_coordinator(tmp_path, RESET_EXPERIMENT="true")
    record, current = on_disk(tmp_path)
    assert record.run_id != old_run
    assert record.public_key == reset.key.public != first.key.public and signed_by(current, reset.key.public)
    assert list((tmp_path / "drive" / "archives").iterdir())


def test_a_coordinator_whose_key_file_holds_another_key_refuses(tmp_path):
    open_coordinator(tmp_path)
    other = tmp_path / "other" / KEY_FILE_NAME
    CoordinatorKey.load_or_create(other)
    with pytest.raises(ExperimentMismatchError, match="holds key .*point COORDINATOR_KEY_FILE at the experiment's"):
        open_coordinator(tmp_path, COORDINATOR_KEY_FILE=other)


def test_coordinator_key_file_is_refused_inside_the_shared_folder(tmp_path):
    with pytest.raises(ConfigError, match="COORDINATOR_KEY_FILE"):
        config(tmp_path, COORDINATOR_KEY_FILE=tmp_path / "drive" / "keys" / "k.pem")


def test_a_coordinator_restarted_while_experiment_json_is_forged_writes_its_own_back(tmp_path):
    open_coordinator(tmp_path)
    real = on_disk(tmp_path)[0]
    path = tmp_path / "drive" / LAYOUT.experiment_file
    for forged in (real.model_copy(update={"run_id": OTHER}), real.model_copy(update={"public_key": None})):
        path.write_bytes(encode(forged))
        _, resumed = open_coordinator(tmp_path)
        assert on_disk(tmp_path)[0] == real and resumed.run_id == real.run_id


# -- a worker's pin ----------------------------------------------------------------------------


def test_a_pin_accepts_the_pinned_key_and_a_newer_run_of_it_only(tmp_path):
    key, other = new_key(tmp_path), new_key(tmp_path, "other.pem")
    first = experiment(key)
    assert pin_verdict({}, first) is None  # first contact: trusted
    assert pin_verdict({}, experiment(None)) is None  # an experiment without a key: today's rule
    pin = pin_of(first)
    assert pin_verdict(pin, first) is None
    assert pin_verdict(pin, experiment(key, OTHER, created_at=20.0)) is None  # a reset by the coordinator
    assert "created before the pinned run" in pin_verdict(pin, experiment(key, OTHER, created_at=5.0))
    assert "not signed by the coordinator key it names" in pin_verdict(pin, first.model_copy(update={"run_id": OTHER}))
    assert "not signed by the coordinator key it names" in pin_verdict({}, first.model_copy(update={"run_id": OTHER}))
    for forged in (experiment(other, OTHER, created_at=20.0), experiment(None, OTHER, created_at=20.0)):
        why = pin_verdict(pin, forged)
        assert "not the key this worker pinned" in why and "REPIN_COORDINATOR_KEY=true" in why, why
        assert pin_verdict(pin, forged, repin=True) is None


# -- the trust rule of a keyed experiment ------------------------------------------------------


@pytest.fixture
def keyed(tmp_path):
    """The coordinator's exchange (signing), a forger's, and a worker's follower that pinned the coordinator key."""
    storage = LocalStorage(tmp_path)
    key, mallory = new_key(tmp_path), new_key(tmp_path, "mallory.pem")
    writer = Exchange(storage, LAYOUT, "coord")
    writer.signer = key.sign
    forger = Exchange(storage, LAYOUT, "mallory")
    writer.write_experiment(experiment(key))
    rejected: list[str] = []
    clock = Clock()
    reader = Exchange(storage, LAYOUT, "w1", run_id=RUN)
    follower = StateFollower(
        reader, experiment(key), None, 2.0, lambda path, why: rejected.append(why), clock, 4.0, key=key.public
    )
    return writer, forger, mallory, follower, rejected, clock, key


@pytest.mark.parametrize("signer", ["none", "mallory", "stale"])
@pytest.mark.parametrize(
    "change",
    [
        {"status": "finished", "round": 10},
        {"status": "stopped"},
        {"round": 1},  # even what an honest coordinator could write next
        {"round": 999, "max_rounds": 1000},
    ],
)
def test_a_state_the_pinned_key_did_not_sign_is_never_played_however_long_it_stays(keyed, signer, change):
    writer, forger, mallory, follower, rejected, clock, key = keyed
    writer.write_state(state(0, 2))
    assert follower.read(0).seq == 2
    fake = state(0, 3, **change)
    if signer == "mallory":
        fake = mallory.sign(fake)
    elif signer == "stale":  # the coordinator's signature of another state, copied
        fake = fake.model_copy(update={"signature": key.sign(state(0, 2)).signature})
    forger.write_state(fake)
    for _ in range(10):
        clock.now += 1.0
        assert follower.read(1).seq == 2
    assert len(rejected) == 1 and "is not signed by the coordinator key this worker pinned" in rejected[0], rejected
    clock.now += UNSIGNED_REPORT_SECONDS
    forger.write_state(fake.model_copy(update={"seq": 4}))
    assert follower.read(1).seq == 2
    assert len(rejected) == 2 and "(9 more since the last such line)" in rejected[1], rejected
    writer.write_state(state(1, 5))  # the coordinator's next state is played at once
    assert follower.read(1).seq == 5


def test_a_forged_run_change_in_both_files_ends_no_worker_however_long_it_stays(keyed):
    writer, forger, mallory, follower, rejected, clock, key = keyed
    writer.write_state(state(0, 2))
    follower.read(0)
    for fake_experiment, fake_state in (
        (experiment(mallory, OTHER, created_at=20.0), mallory.sign(state(0, 3, run_id=OTHER))),
        (experiment(key, OTHER, created_at=20.0).model_copy(update={"run_id": "c" * 16}), state(0, 3, run_id="c" * 16)),
    ):
        forger.write_experiment(fake_experiment)
        forger.write_state(fake_state)
        for _ in range(20):
            clock.now += 1.0
            assert follower.read(1).seq == 2  # no RunChangedError


def test_a_reset_by_the_pinned_key_is_followed_at_once_and_an_older_run_of_it_never(keyed):
    writer, forger, mallory, follower, rejected, clock, key = keyed
    writer.write_state(state(0, 2))
    follower.read(0)
    older = experiment(key, OTHER, created_at=5.0)  # an archived run of the same key, put back in place
    forger.write_experiment(older)
    forger.write_state(key.sign(state(0, 9, run_id=OTHER)))
    clock.now += 30
    assert follower.read(1).seq == 2
    assert any("no newer experiment.json of it" in r for r in rejected), rejected
    writer.write_experiment(experiment(key, OTHER, created_at=20.0))
    with pytest.raises(RunChangedError, match="signed run"):
        follower.read(1)


def test_a_signed_state_is_played_at_once_and_a_forgery_written_over_it_hides_nothing(keyed):
    """The coordinator's last state, ``finished``, overwritten by a forger right after (the coordinator has exited):
    the worker plays the finish, at once, whatever the file shows next."""
    writer, forger, mallory, follower, rejected, clock, key = keyed
    writer.write_state(state(3, 9))
    follower.read(3)
    writer.write_state(state(4, 10, status="finished", coordinator_id="coord2"))  # a jump, another NODE_ID: signed
    assert follower.read(4).status == "finished"
    forger.write_state(state(4, 11, run_id=OTHER))
    clock.now += 60
    assert follower.read(4).seq == 10


def test_a_fresh_workers_first_signed_finish_waits_the_window_against_a_replay(keyed):
    writer, forger, mallory, follower, rejected, clock, key = keyed
    finished = key.sign(state(4, 10, status="finished"))
    forger.write_state(finished)  # put back in place: signed, but maybe of before MAX_ROUNDS was raised
    assert follower.read(0) is None
    forger.write_state(state(0, 11, status="finished"))  # unsigned: changes nothing, neither way
    clock.now += 2.0
    assert follower.read(0) is None
    forger.write_state(finished)
    assert follower.read(0).status == "finished"  # it stayed (the unsigned one aside) for the window


def test_a_follower_of_an_experiment_without_a_key_keeps_the_confirm_window(tmp_path):
    storage = LocalStorage(tmp_path)
    writer = Exchange(storage, LAYOUT, "coord")
    writer.write_experiment(experiment(None))
    clock = Clock()
    follower = StateFollower(Exchange(storage, LAYOUT, "w1", run_id=RUN), experiment(None), None, 2.0, clock=clock)
    writer.write_state(state(0, 2))
    follower.read(0)
    writer.write_state(state(0, 3, status="finished"))
    assert follower.read(1).seq == 2
    clock.now += 2.0
    assert follower.read(1).status == "finished"  # unsigned, and it stayed: played, as before keys


# -- the hypothesis fuzzer of the lifecycle (issue #30, class 3) -------------------------------


@pytest.fixture(scope="module")
def two_keys(tmp_path_factory):
    """The coordinator's key and a forger's, made once (a key file each) for every example of the fuzzer."""
    where = tmp_path_factory.mktemp("fuzz-keys")
    return CoordinatorKey.load_or_create(where / "k.pem"), CoordinatorKey.load_or_create(where / "mallory.pem")


@st.composite
def forgeries(draw) -> tuple[StateRecord, str, str, float]:
    """One forged state: any lifecycle change (finish, stop, a jump, another run, another NODE_ID, a mode), how it
    is signed (not; by the forger's own key; with the coordinator's signature of another state copied; signed by
    the coordinator key and changed after), what experiment.json is planted beside it, and how long it stays."""
    fake = state(
        draw(st.integers(0, 1000)),
        draw(st.integers(3, 10**6)),
        status=draw(st.sampled_from(["waiting", "running", "finished", "stopped"])),
        run_id=draw(st.sampled_from([RUN, OTHER, "c" * 16])),
        max_rounds=draw(st.integers(1, 2000)),
        coordinator_id=draw(st.sampled_from(["coord", "coord2", "w1"])),
        advance_reason=draw(st.sampled_from(["start", "resume", "all_submitted", "interval", "finished", "deadline"])),
        mode=draw(st.sampled_from(["sync", "async"])),
        live_workers=draw(st.lists(st.sampled_from(["w1", "w2", "w3"]), max_size=3, unique=True)),
        updated_at=draw(st.floats(0, 1e9)),
    )
    signer = draw(st.sampled_from(["none", "mallory", "stale", "tampered"]))
    planted = draw(st.sampled_from(["none", "mallory_run", "run_changed"]))
    return fake, signer, planted, draw(st.floats(0, 120))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(forgeries(), min_size=1, max_size=4))
def test_no_lifecycle_change_the_pinned_key_did_not_sign_is_ever_played(two_keys, planted):
    """Whatever a participant writes into the state file and experiment.json, for however long, a worker that pinned
    the coordinator key plays none of it (no finish, stop, jump, reset or run change: the state it follows stays the
    coordinator's, and no RunChangedError), and the coordinator's next state is played at once."""
    key, mallory = two_keys
    with tempfile.TemporaryDirectory() as tmp:
        storage = LocalStorage(Path(tmp))
        writer = Exchange(storage, LAYOUT, "coord")
        writer.signer = key.sign
        forger = Exchange(storage, LAYOUT, "mallory")
        writer.write_experiment(experiment(key))
        clock = Clock()
        follower = StateFollower(
            Exchange(storage, LAYOUT, "w1", run_id=RUN),
            experiment(key),
            None,
            2.0,
            lambda *a: None,
            clock,
            4.0,
            key=key.public,
        )
        writer.write_state(state(0, 2))
        assert follower.read(0).seq == 2
        for fake, signer, beside, stays in planted:
            if signer == "mallory":
                fake = mallory.sign(fake)
            elif signer == "stale":  # the coordinator's signature of the state it wrote, copied onto another
                fake = fake.model_copy(update={"signature": key.sign(state(0, 2)).signature})
            elif signer == "tampered":  # signed by the coordinator key, then changed
                fake = key.sign(fake).model_copy(update={"seq": fake.seq + 1})
            if beside == "mallory_run":
                forger.write_experiment(experiment(mallory, fake.run_id, created_at=50.0))
            elif beside == "run_changed":
                forger.write_experiment(experiment(key).model_copy(update={"run_id": fake.run_id}))
            forger.write_state(fake)
            for step in (0.0, stays / 2, stays / 2):
                clock.now += step
                played = follower.read(1)
                assert played is not None and played.seq == 2 and played.run_id == RUN, (fake, signer, beside)
        writer.write_experiment(experiment(key))
        writer.write_state(state(1, 5))
        assert follower.read(1).seq == 5  # the coordinator's next state, at once


# -- notebooks: the key in your own My Drive ---------------------------------------------------


def test_the_notebooks_keep_the_coordinator_key_in_my_drive_beside_the_shared_folder(tmp_path: Path, capsys):
    from swarm_gdrive import notebook

    drive = tmp_path / "drive"
    (drive / "MyDrive" / "rl-swarm").mkdir(parents=True)
    env = notebook.node_env(str(drive / "MyDrive" / "rl-swarm"), "x", storage="mount", drive_mount=str(drive))
    assert env["COORDINATOR_KEY_FILE"] == str(drive / "MyDrive" / "swarm-gdrive-keys" / "x" / KEY_FILE_NAME)
    assert notebook.effective_config(env).coordinator_key_file == env["COORDINATOR_KEY_FILE"]
    # The shared folder is My Drive itself: the key stays in the runtime, and the notebook says so.
    env = notebook.node_env(str(drive / "MyDrive"), "x", storage="mount", drive_mount=str(drive))
    assert "COORDINATOR_KEY_FILE" not in env and "would be inside the shared folder" in capsys.readouterr().out
    # Not mounted (outside Colab): the default under SWARM_LOCAL_DIR.
    other = tmp_path / "elsewhere"
    other.mkdir()
    assert "COORDINATOR_KEY_FILE" not in notebook.node_env(str(other), "x", drive_mount=str(tmp_path / "no-drive"))
