"""The monitor and the reading commands (status, validate, report, compare) against a hostile or broken folder
(issue 14): the 5 KB file with an integer of 5,000 digits in every kind of file and in both logs, type
confusion (a folder where a file belongs, a file or FIFO where a folder belongs, a file for each top folder),
and metric lines of distinct keys for the monitor's memory. The commands keep their exit codes and output, and
say what they could not read (the ``unreadable`` finding)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from faultkit import LAYOUT
from hostile import HUGE_REASON, huge_int, plant

from swarm_gdrive.protocol.exchange import Exchange
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.storage import LocalStorage


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    from swarm_threads import fast_env, run_threads

    folder = tmp_path_factory.mktemp("finished") / "drive"
    folder.mkdir()
    run_threads(fast_env(folder, LAYOUT.experiment, MIN_WORKERS=2, MAX_ROUNDS=2, NUM_TRANSPLANT_TREES=1), 2)
    return folder


def plant_everywhere(folder: Path) -> list[str]:
    """The huge integer in every kind of file and in both logs, and type confusion; returns the planted paths."""
    layout = LAYOUT
    planted = [
        plant(folder, layout.peer_file("bigint"), huge_int("peer")),
        plant(folder, layout.reward_file(0, 0, "bigint"), huge_int("reward")),
        plant(folder, layout.rollout_file(0, 0, "bigint"), huge_int("rollouts")),
        plant(folder, layout.eval_file(0, "bigint"), huge_int("eval")),
        plant(folder, layout.peer_file("dirpeer"), directory=True),
        plant(folder, f"{layout.evals_dir}/round_5", b"x"),
        plant(folder, f"{layout.rewards_dir}/round_1/stage_3", fifo=True),
        plant(folder, f"{layout.root}/logs/filenode", b"x"),
        plant(folder, layout.metrics_file("dirlog"), directory=True),
    ]
    for node, name in (("w1", "metrics.jsonl"), ("w2", "training_events.jsonl")):
        path = f"{layout.logs_dir(node)}/{name}"
        with open(folder / path, "ab") as fh:
            fh.write(huge_int("metric" if name == "metrics.jsonl" else "event") + b"\n")
        planted.append(path)
    return planted


def run_cli(*args: str) -> tuple[int, str, str]:
    """``swarm-gdrive ARGS`` in a fresh interpreter: its exit code, output and error output."""
    entry = "from swarm_gdrive.cli import main; main()"
    proc = subprocess.run([sys.executable, "-c", entry, *args], capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def test_status_validate_report_and_compare_survive_hostile_files_and_say_so(finished, tmp_path):
    hostile = tmp_path / "hostile"
    shutil.copytree(finished, hostile)
    planted = plant_everywhere(hostile)
    where = ["--folder", str(hostile), "--experiment", LAYOUT.experiment]

    code, out, err = run_cli("status", *where)
    assert code == 0 and "Traceback" not in err, err
    assert "WARNING unreadable: 11 file(s) or line(s) could not be read" in out, out
    assert f"{LAYOUT.peer_file('bigint')}: {HUGE_REASON}" in out, out

    clean = ["--folder", str(finished), "--experiment", LAYOUT.experiment]
    for args in (["validate", "--rounds", "2", "--nodes", "2", "--transplants", "1"], ["compare", "--baseline"]):
        args = [*args, LAYOUT.experiment] if args[0] == "compare" else args
        expected, clean_out, _ = run_cli(*args, *clean)
        code, out, err = run_cli(*args, *where)
        assert (code, "Traceback" in err) == (expected, False), err
        assert out == clean_out  # the same verdict and the same table: the hostile files changed nothing

    code, out, err = run_cli("report", "--out", str(tmp_path / "report"), *where)
    assert code == 0 and "Traceback" not in err, err
    page = (tmp_path / "report" / "index.html").read_text()
    assert "could not be read" in page and LAYOUT.peer_file("bigint") in page

    from swarm_gdrive.observe.monitor import load

    problems = load(LocalStorage(hostile), LAYOUT.experiment).problems
    for path in planted:
        assert any(p.startswith(f"{path}: ") for p in problems), (path, problems)


def test_the_monitor_memory_is_linear_in_hostile_metric_lines_of_distinct_keys(tmp_path):
    """0.6 MB of metric lines of 256 fresh keys each made the monitor's table 284 x 72,706 (+363 MB), 1.2 MB
    made it +1.8 GB: one column per distinct key. Now a node brings at most 256 keys."""
    script = [sys.executable, str(Path(__file__).with_name("metric_memory.py"))]
    peaks = {}
    for mb in (0.6, 4.0):
        folder = tmp_path / f"m{mb}"
        subprocess.run([*script, "write", str(folder), str(mb)], timeout=120, check=True)
        out = subprocess.run([*script, "load", str(folder)], capture_output=True, text=True, timeout=240, check=True)
        peaks[mb] = json.loads(out.stdout.splitlines()[-1])
    for peak in peaks.values():
        assert peak["columns"] == 3 + 256 and peak["over_cap"], peaks
    assert peaks[0.6]["grew_mb"] < 40 and peaks[4.0]["grew_mb"] < 60, peaks  # above the interpreter with pandas


def test_a_layout_with_a_file_for_each_folder_reads_as_empty_and_the_monitor_says_so(tmp_path):
    from swarm_gdrive.observe.monitor import load

    layout = Layout("e")
    folders = [layout.state_dir, layout.peers_dir, layout.rewards_dir, layout.rollouts_dir, layout.evals_dir]
    for rel in [*folders, f"{layout.root}/logs"]:
        plant(tmp_path, rel, b"x")
    problems = load(LocalStorage(tmp_path), "e").problems
    for rel in [*folders, f"{layout.root}/logs"]:
        assert any(p.startswith(f"{rel}: not a folder") for p in problems), (rel, problems)
    rejected: dict[str, str] = {}
    exchange = Exchange(LocalStorage(tmp_path), layout, "w1", run_id="0123456789abcdef", on_reject=rejected.__setitem__)
    assert exchange.read_peers() == {} and exchange.registered_workers() == set()
    assert exchange.read_rewards(0, 0) == {} and exchange.read_rollouts(0, 0) == {} and exchange.read_evals() == []
    assert exchange.own_rollout_rounds() == [] and exchange.cleanup_rollouts(5, 1, False) == 0
    assert exchange.remove_empty_rollout_dirs(5) == 0
