"""The monitor on real experiment folders: the real coordinator and workers run in-process (synthetic)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from swarm_gdrive.cli import main as cli_main
from swarm_gdrive.observe.monitor import findings, load, validate
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.storage import LocalStorage

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from swarm_threads import fast_env, run_threads  # noqa: E402

EXPERIMENT = "mon"
LAYOUT = Layout(EXPERIMENT)
ENTRY = "from swarm_gdrive.cli import main; main()"


def run_swarm(folder: Path, workers: int = 2, rounds: int = 3, transplants: int = 1) -> None:
    env = fast_env(folder, EXPERIMENT, MIN_WORKERS=workers, MAX_ROUNDS=rounds, NUM_TRANSPLANT_TREES=transplants)
    run_threads(env, workers)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("shared")
    run_swarm(folder)
    return folder


@pytest.fixture
def broken(finished, tmp_path) -> Path:
    """The finished run as if w2 had been killed after round 1: no reward nor rollouts for round 2, and its
    peer file still says alive (a killed process never writes stopped)."""
    import shutil

    folder = tmp_path / "broken"
    shutil.copytree(finished, folder)
    (folder / LAYOUT.reward_file(2, 0, "w2")).unlink()
    (folder / LAYOUT.rollout_file(2, 0, "w2")).unlink()
    _rewrite_peer(folder, "w2", status="alive")
    return folder


def monitor(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", ENTRY, *args, "--folder", str(folder), "--experiment", EXPERIMENT],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_load_reads_every_table(finished):
    snap = load(LocalStorage(finished), EXPERIMENT)
    state = snap.state_record
    assert (state["status"], state["round"], state["max_rounds"]) == ("finished", 3, 3)
    assert snap.workers() == ["w1", "w2"]
    assert set(snap.peers["node"]) == {"coord", "w1", "w2"}
    assert snap.peers["alive"].dtype == bool
    assert sorted(set(zip(snap.rewards["node"], snap.rewards["round"], strict=True))) == [
        (w, r) for w in ("w1", "w2") for r in range(3)
    ]
    assert len(snap.rollouts_per_round) == 6 and set(snap.rollouts_per_round["groups"]) == {3}
    assert (snap.rewards["external_groups"] > 0).any()
    assert {"worker_started", "experiment_finished"} <= set(snap.events["event"])
    assert set(snap.events["level"]) <= {"debug", "info", "warning", "error"}
    assert not snap.metrics.empty and {"node", "ts", "round"} <= set(snap.metrics.columns)
    assert snap.log_files["w1"] == {"metrics.jsonl", "training_events.jsonl"}
    assert snap.config["num_transplant_trees"] == 1
    assert snap.problems == []


def test_a_healthy_run_validates_and_has_no_warnings(finished):
    snap = load(LocalStorage(finished), EXPERIMENT)
    assert validate(snap, rounds=3, nodes=2, transplants=1) == []
    found = findings(snap)
    codes = [(f.severity, f.code) for f in found]
    assert codes == [("info", "state"), ("info", "storage"), ("info", "experiment_size")]
    assert "finished, round 3 of 3" in found[0].message
    assert "over 3 round(s)" in found[1].message and "MB a round" in found[1].message
    failed = validate(snap, rounds=4, nodes=3, transplants=1)
    assert any("expected finished at round 4" in m for m in failed)
    assert any("expected 3" in m for m in failed)


def test_a_worker_that_died_after_round_1_is_reported(broken):
    # The peers' last heartbeats are an hour old by the monitor's clock.
    snap = load(LocalStorage(broken), EXPERIMENT, now=snap_time(broken) + 3600)
    assert not snap.peers["alive"].any()
    failed = validate(snap, rounds=3, nodes=2, transplants=1)
    assert "a reward per worker per round: no reward from w2 for round 2" in failed
    assert "a rollout file per worker per round: no valid rollout file from w2 for round 2" in failed
    found = findings(snap)
    codes = {(f.severity, f.code) for f in found}
    assert ("warning", "missing_reward") in codes
    (missing,) = [f for f in found if f.code == "missing_reward"]
    assert missing.message == "worker w2: no reward for round(s) 2"
    (stale,) = [f for f in found if f.code == "stale_heartbeat"]
    assert stale.severity == "warning" and stale.message.startswith("worker w2: last heartbeat 3600 s ago")
    # w1 and the coordinator said they stopped; a finished experiment needs no coordinator.
    assert "coordinator_stale" not in codes and not any(f.severity == "error" for f in found)


def test_a_stale_alive_worker_and_coordinator_are_reported(broken):
    storage = LocalStorage(broken)
    _rewrite_peer(broken, "coord", status="alive")
    _rewrite_state(broken, status="running", round=2)
    snap = load(storage, EXPERIMENT, now=snap_time(broken) + 3600)
    found = findings(snap)
    by_code = {f.code: f for f in found}
    assert by_code["stale_heartbeat"].severity == "warning" and "w2" in by_code["stale_heartbeat"].message
    assert by_code["coordinator_stale"].severity == "error"
    assert found[0].severity == "error"
    # Round 2 is now the current round: not yet missing.
    assert "missing_reward" not in by_code


def test_error_events_fail_validation_and_are_findings(finished, tmp_path):
    import shutil

    from swarm_gdrive.protocol.records import EventRecord, encode_line

    folder = tmp_path / "errors"
    shutil.copytree(finished, folder)
    with (folder / LAYOUT.events_file("w1")).open("ab") as f:
        for _ in range(2):
            f.write(encode_line(EventRecord(node_id="w1", ts=1.0, event="worker_gave_up", level="error", message="x")))
    snap = load(LocalStorage(folder), EXPERIMENT)
    assert "no error events: w1: worker_gave_up: x" in validate(snap, 3, 2, 1)
    (err,) = [f for f in findings(snap) if f.code == "error_events"]
    assert err.severity == "error" and err.message.startswith("w1: 2 error event(s)")


def test_commands_as_subprocesses(finished, broken):
    ok = monitor(finished, "validate", "--rounds", "3", "--nodes", "2", "--transplants", "1")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "PASS a reward per worker per round" in ok.stdout and "FAIL" not in ok.stdout
    bad = monitor(broken, "validate", "--rounds", "3", "--nodes", "2", "--transplants", "1")
    assert bad.returncode == 1
    assert "FAIL a reward per worker per round" in bad.stdout and "no reward from w2 for round 2" in bad.stdout
    status = monitor(finished, "status")
    assert status.returncode == 0, status.stderr
    assert "w1" in status.stdout and "w2" in status.stdout and "INFO" in status.stdout


def test_status_in_process(finished, capsys):
    with pytest.raises(SystemExit) as exited:
        cli_main(["status", "--folder", str(finished), "--experiment", EXPERIMENT])
    code = exited.value.code
    out = capsys.readouterr().out
    assert code == 0 and "reward (last 5)" in out and "stopped" in out


def snap_time(folder: Path) -> float:
    snap = load(LocalStorage(folder), EXPERIMENT)
    return float(snap.peers["heartbeat_at"].max())


def _rewrite_peer(folder: Path, node: str, **update: object) -> None:
    from swarm_gdrive.protocol.records import PeerRecord, decode, encode

    path = folder / LAYOUT.peer_file(node)
    path.write_bytes(encode(decode(path.read_bytes(), PeerRecord).model_copy(update=update)))


def _rewrite_state(folder: Path, **update: object) -> None:
    from swarm_gdrive.protocol.records import StateRecord, decode, encode

    path = folder / LAYOUT.state_file
    path.write_bytes(encode(decode(path.read_bytes(), StateRecord).model_copy(update=update)))


def test_a_round_long_past_its_deadline_means_the_coordinator_stopped_advancing(finished):
    import dataclasses

    snap = load(LocalStorage(finished), EXPERIMENT)
    state = snap.state.copy()
    state.loc[:, "status"] = "running"
    late = dataclasses.replace(snap, state=state, now=float(state["round_deadline"].iloc[0]) + 1000)
    codes = {f.code: f.severity for f in findings(late, liveness_timeout=120)}
    assert codes["coordinator_not_advancing"] == "error"
    on_time = dataclasses.replace(snap, state=state, now=float(state["round_deadline"].iloc[0]) + 10)
    assert "coordinator_not_advancing" not in {f.code for f in findings(on_time, liveness_timeout=120)}


def test_large_rollouts_are_flagged(finished, monkeypatch):
    import swarm_gdrive.observe.monitor as monitor

    monkeypatch.setattr(monitor, "STORAGE_WARNING_BYTES", 10)
    found = {f.code: f for f in findings(load(LocalStorage(finished), EXPERIMENT))}
    assert (
        found["storage_growth"].severity == "warning" and "ROLLOUT_CLEANUP_ENABLED" in found["storage_growth"].message
    )


@pytest.mark.parametrize("how", ["state", "peer_file"])
def test_a_stopped_coordinator_is_said_instead_of_running_with_live_workers(finished, tmp_path, how):
    """The state ``stopped`` (what a coordinator's stop button writes), or a ``running`` state whose coordinator's
    peer file says stopped: the summary names the coordinator as stopped and the workers still beating (none
    here, every worker exited), not the state's stale ``live_workers``; a finding says how to resume."""
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(finished, folder)
    _rewrite_state(folder, status="stopped" if how == "state" else "running", round=2, live_workers=["w1", "w2"])
    snap = load(LocalStorage(folder), EXPERIMENT)
    found = {f.code: f for f in findings(snap, liveness_timeout=120)}
    summary = found["state"].message
    assert "coordinator coord stopped" in summary and "workers still beating: none" in summary, summary
    assert "live workers: w1, w2" not in summary
    assert ("(its peer file)" in summary) == (how == "peer_file")
    advice = found["coordinator_stopped"]
    assert advice.severity == "warning" and "start the coordinator again" in advice.message


def test_a_running_coordinator_is_not_said_to_be_stopped(finished, tmp_path):
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(finished, folder)
    _rewrite_state(folder, status="running", round=2, live_workers=["w1", "w2"])
    _rewrite_peer(folder, "coord", status="alive")
    snap = load(LocalStorage(folder), EXPERIMENT)
    found = {f.code: f for f in findings(snap, liveness_timeout=120)}
    assert "coordinator_stopped" not in found
    assert found["state"].message.endswith("live workers: w1, w2")
