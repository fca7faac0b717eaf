"""The `swarm-gdrive` command and the launcher as a user runs them: real subprocesses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from swarm_gdrive.config import env_fields
from swarm_gdrive.procs import NodeProcess
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import EventRecord, PeerRecord, decode, decode_lines

pytestmark = pytest.mark.integration


def launch(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in {f.metadata["env"] for f in env_fields()}}
    return subprocess.run(
        [sys.executable, "-m", "swarm_gdrive.launcher", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def quick_env(folder: Path, **extra: str) -> dict[str, str]:
    return {
        "GDRIVE_PATH": str(folder),
        "EXPERIMENT_NAME": "cli",
        "WORKLOAD": "synthetic",
        "SWARM_LOCAL_DIR": str(folder.parent / "local"),
        "HEARTBEAT_INTERVAL": "0.2",
        "LIVENESS_TIMEOUT": "5",
        "POLL_INTERVAL_MIN": "0.05",
        "POLL_INTERVAL_MAX": "0.3",
        **extra,
    }


BAD_INPUTS = [
    ({"NODE_ROLE": "boss"}, "NODE_ROLE='boss'", "coordinator, worker"),
    ({"NUM_TRAIN_SAMPLES": "0"}, "NUM_TRAIN_SAMPLES='0'", ">= 1"),
    ({"NUM_GENERATIONS": "-2"}, "NUM_GENERATIONS='-2'", ">= 1"),
    ({"MAX_ROUNDS": "many"}, "MAX_ROUNDS='many'", "whole number"),
    ({"NUM_TRANSPLANT_TREES": "-1"}, "NUM_TRANSPLANT_TREES='-1'", ">= 0"),
    ({"EXPERIMENT_NAME": "../x"}, "EXPERIMENT_NAME='../x'", "no '/'"),
    ({"EXPERIMENT_NAME": "/"}, "EXPERIMENT_NAME='/'", "no '/'"),
    ({"EXPERIMENT_NAME": ""}, "EXPERIMENT_NAME=''", "letters, digits"),
    ({"NODE_ID": "../../x"}, "NODE_ID='../../x'", "no '/'"),
    ({"COORDINATOR_ROUND_INTERVAL": "0"}, "COORDINATOR_ROUND_INTERVAL='0'", "seconds > 0"),
    ({"ROLLOUT_PUBLISH_FREQUENCY": "often"}, "ROLLOUT_PUBLISH_FREQUENCY='often'", "generation, stage, round"),
]


@pytest.mark.parametrize(
    ("bad", "names", "fix"), BAD_INPUTS, ids=[next(iter(b)) + "=" + next(iter(b.values())) for b, _, _ in BAD_INPUTS]
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, bad, names, fix):
    folder = tmp_path / "drive"
    folder.mkdir()
    result = launch({**quick_env(folder), **bad})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert names in lines[0] and fix in lines[0], lines[0]
    assert list(folder.iterdir()) == []
    assert not (tmp_path / "local").exists()


def test_missing_or_absent_gdrive_path(tmp_path):
    env = quick_env(tmp_path / "nope")
    result = launch(env)
    assert result.returncode == 2 and "GDRIVE_PATH=" in result.stderr and "mount" in result.stderr
    del env["GDRIVE_PATH"]
    result = launch(env)
    assert result.returncode == 2 and "GDRIVE_PATH=<unset>" in result.stderr
    assert not (tmp_path / "nope").exists()


def test_unwritable_gdrive_path(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() == 0:  # root writes through permission bits: use a read-only mount instead
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], capture_output=True
        )
        if mounted.returncode != 0:
            pytest.skip("running as root and cannot mount a read-only tmpfs")
    else:
        folder.chmod(0o500)
    try:
        result = launch(quick_env(folder))
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(folder)], check=True)
    assert result.returncode == 2
    assert "GDRIVE_PATH=" in result.stderr and "not writable" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_coordinator_refuses_an_experiment_with_another_config(tmp_path):
    folder = tmp_path / "drive"
    folder.mkdir()
    env = quick_env(folder, NODE_ROLE="coordinator", MAX_ROUNDS="1", SEED="1")
    first = NodeProcess("coordinator", env)
    deadline = time.monotonic() + 30
    while not (folder / "experiments/cli/state/current_state.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.terminate() == 0
    result = launch({**env, "SEED": "2"})
    assert result.returncode == 2
    assert "SEED=1 (now 2)" in result.stderr and "RESET_EXPERIMENT=true" in result.stderr


def test_a_worker_with_other_settings_is_refused_naming_them(tmp_path):
    folder = tmp_path / "drive"
    folder.mkdir()
    env = quick_env(folder, NODE_ROLE="coordinator", MIN_WORKERS="5", NUM_GENERATIONS="8", SEED="1")
    coordinator = NodeProcess("coordinator", env)
    try:
        deadline = time.monotonic() + 30
        while not (folder / "experiments/cli/experiment.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        worker = launch({**env, "NODE_ROLE": "worker", "NODE_ID": "w1", "NUM_GENERATIONS": "4", "SEED": "2"})
    finally:
        assert coordinator.terminate() == 0
    assert worker.returncode == 2, worker.stderr
    error = [line for line in worker.stderr.splitlines() if line.startswith("swarm-gdrive: error:")]
    assert len(error) == 1, worker.stderr
    assert "NUM_GENERATIONS=4 (experiment: 8)" in error[0] and "SEED=2 (experiment: 1)" in error[0]
    events, _ = decode_lines((folder / Layout("cli").events_file("w1")).read_bytes(), EventRecord)
    assert [e.event for e in events] == ["worker_refused"]
    assert not list((folder / "experiments/cli").glob("rewards/**/*.json"))


def test_readers_name_the_experiments_that_exist_when_one_is_misspelt(tmp_path):
    folder = tmp_path / "drive"
    (folder / "experiments" / "run-a").mkdir(parents=True)
    (folder / "experiments" / "run-b").mkdir()
    clean = {k: v for k, v in os.environ.items() if k not in {f.metadata["env"] for f in env_fields()}}
    base = [sys.executable, "-m", "swarm_gdrive", "{cmd}"]
    commands = {
        "status": ["--folder", str(folder), "--experiment", "run-c"],
        "validate": ["--folder", str(folder), "--experiment", "run-c", "--rounds", "1", "--nodes", "1"],
        "report": ["--folder", str(folder), "--experiment", "run-c", "--out", str(tmp_path / "r")],
        "compare": ["run-a", "run-c", "--baseline", "run-a", "--folder", str(folder)],
    }
    for command, args in commands.items():
        argv = [part.format(cmd=command) for part in base] + args
        result = subprocess.run(argv, env=clean, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert "no experiment 'run-c'" in result.stderr and "experiments there: run-a, run-b" in result.stderr
        assert not (tmp_path / "r").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "swarm_gdrive", "status", "--folder", str(empty), "--experiment", "x"],
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "experiments there: none yet" in result.stderr


def test_sigterm_stops_a_waiting_worker_cleanly_and_a_restart_keeps_its_identity(tmp_path):
    folder = tmp_path / "drive"
    folder.mkdir()
    env = quick_env(folder, NODE_ROLE="worker", TEST_MODE="true")
    coordinator = NodeProcess("coordinator", {**env, "NODE_ROLE": "coordinator", "MIN_WORKERS": "5"})
    layout = Layout("cli")
    peers = folder / layout.peers_dir
    try:
        worker = NodeProcess("worker", env)  # no NODE_ID: generated and persisted
        deadline = time.monotonic() + 30
        while len(list(peers.glob("worker-*.json"))) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        (peer_file,) = peers.glob("worker-*.json")
        node_id = peer_file.stem
        assert worker.terminate(timeout=20) == 0
        assert decode(peer_file.read_bytes(), PeerRecord).status == "stopped"
        events, _ = decode_lines((folder / layout.events_file(node_id)).read_bytes(), EventRecord)
        assert [e.event for e in events][-1] == "worker_stopped"
        assert any("3 rounds, I=4 J=0 G=4, TEST_MODE" in line for line in worker.lines), "TEST_MODE's settings said"

        again = NodeProcess("worker-again", env)
        deadline = time.monotonic() + 30
        while decode(peer_file.read_bytes(), PeerRecord).status != "alive" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(p.stem for p in peers.glob("worker-*.json")) == [node_id]
        again.proc.send_signal(signal.SIGINT)  # Ctrl-C is a clean stop too
        assert again.wait(timeout=20) == 0
    finally:
        coordinator.terminate()


def test_env_command_lists_every_variable():
    out = subprocess.run(
        [sys.executable, "-m", "swarm_gdrive", "env"], capture_output=True, text=True, check=True
    ).stdout
    for f in env_fields():
        assert f.metadata["env"] in out


@pytest.mark.parametrize(
    "command", [[], ["run"], ["env"], ["demo"], ["report"], ["compare"], ["status"], ["validate"], ["dashboard"]]
)
def test_help_is_plain_text(command):
    out = subprocess.run(
        [sys.executable, "-m", "swarm_gdrive", *command, "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "usage: swarm-gdrive" in out
    assert "`" not in out, out  # reStructuredText markup reads as noise in a terminal


def test_the_synthetic_demo_runs_the_protocol_in_seconds(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    result = subprocess.run(
        ["swarm-gdrive", "demo", "--workload", "synthetic", "--folder", str(tmp_path / "drive"), "--rounds", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "workload=synthetic" in result.stdout and "round 1" in result.stdout
    assert (tmp_path / "drive" / "experiments").is_dir()  # kept for the monitor ...
    assert list(scratch.iterdir()) == []  # ... the nodes' identities not: they were this demo's only


def test_status_watch_follows_a_run_until_ctrl_c(tmp_path):
    folder = tmp_path / "drive"
    folder.mkdir()
    env = quick_env(folder, NODE_ROLE="coordinator", MIN_WORKERS="5")
    coordinator = NodeProcess("coordinator", env)
    clean = {k: v for k, v in os.environ.items() if k not in {f.metadata["env"] for f in env_fields()}}
    try:
        deadline = time.monotonic() + 30
        while not (folder / "experiments/cli/state").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        # The command runs as in a terminal's foreground, where Ctrl-C reaches it: SIGINT at its default and not
        # blocked, whatever this test process holds. CI starts the suite as a background job of a non-interactive
        # shell, which POSIX starts with SIGINT ignored, and every child inherits that: the child then ignored
        # SIGINT for 30 s, its main thread still in the --watch loop (seen twice).

        def foreground() -> None:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

        watch = subprocess.Popen(
            [sys.executable, "-m", "swarm_gdrive", "status", "--folder", str(folder), "--experiment", "cli",
             "--watch", "0.3"],
            env={**clean, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=foreground,
        )  # fmt: skip
        # Ctrl-C once it has redrawn 3 times (not after a fixed 3 s: on a loaded machine its start alone took that).
        lines: list[str] = []

        def read() -> None:
            for line in watch.stdout:
                lines.append(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + 90
        while sum(line.startswith("--- ") for line in list(lines)) < 3 and watch.poll() is None:
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.05)
        status = Path(f"/proc/{watch.pid}/status")
        signals = [x for x in status.read_text().splitlines() if x.startswith("Sig")] if status.exists() else []
        watch.send_signal(signal.SIGINT)
        try:
            watch.wait(timeout=30)
        except subprocess.TimeoutExpired:  # where it hangs: faulthandler prints every thread's stack on SIGABRT
            signals += [x for x in status.read_text().splitlines() if x.startswith(("Sig", "ShdPnd"))]
            watch.send_signal(signal.SIGABRT)
            watch.wait(timeout=30)
            err = watch.stderr.read()
            raise AssertionError(f"status --watch still runs 30 s after Ctrl-C ({signals}):\n{err[-6000:]}") from None
        reader.join(10)
        out, err = "".join(lines), watch.stderr.read()
    finally:
        assert coordinator.terminate() == 0
    assert watch.returncode == 0, err
    rules = [line for line in out.splitlines() if line.startswith("--- ")]  # a pipe: no screen clearing
    assert len(rules) >= 3 and "\033[" not in out
    assert out.count("experiment cli: waiting") >= 3 and "(every 0.3 s; Ctrl-C stops)" in out
    bad = subprocess.run(
        [sys.executable, "-m", "swarm_gdrive", "status", "--folder", str(folder), "--watch", "0"],
        env=clean, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "--watch=0: use a number of seconds > 0" in bad.stderr


def test_a_node_opens_with_one_short_settings_line_on_stdout_and_warnings_on_stderr(tmp_path):
    """Colab colours standard error red: ordinary lines go to standard output, warnings to standard error; the
    settings take one short line, every setting only with LOG_SETTINGS=full (or at DEBUG); no token either way."""
    folder = tmp_path / "drive"
    folder.mkdir()
    token = "hf_mustNeverBePrinted1234567890"
    env = quick_env(folder, MAX_ROUNDS="2", MIN_WORKERS="1", HUGGINGFACE_ACCESS_TOKEN=token)
    coordinator = NodeProcess("coordinator", {**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord"})
    try:
        short = launch({**env, "NODE_ROLE": "worker", "NODE_ID": "w1"})
        full = launch({**env, "NODE_ROLE": "worker", "NODE_ID": "w2", "LOG_SETTINGS": "full", "MAX_ROUNDS": "2"})
    finally:
        coordinator.terminate(timeout=20)
    assert short.returncode == 0, short.stdout[-2000:] + short.stderr[-2000:]
    for result in (short, full):
        assert token not in result.stdout + result.stderr
        out, err = result.stdout.splitlines(), result.stderr.splitlines()
        assert out and all(" INFO " in line or " DEBUG " in line for line in out if line[:4].isdigit())
        assert not any(" INFO " in line for line in err), err  # nothing ordinary in red
        assert any(" WARNING " in line and "WORKLOAD=synthetic" in line for line in err)  # a warning stays on stderr
        (opening,) = [line for line in out if "experiment cli on local folder" in line]
        assert "worker w" in opening and "2 rounds, I=8 J=0 G=8" in opening and "ACCESS_TOKEN=<set>" in opening
        assert len(opening) < 400, opening  # it was 2,371 characters
    assert not any("settings: {" in line for line in short.stdout.splitlines())
    (settings,) = [line for line in full.stdout.splitlines() if "settings: {" in line]
    assert "'HUGGINGFACE_ACCESS_TOKEN': '<set>'" in settings and "'SEED': 42" in settings
