"""Names that are not UTF-8 (issue 30, class 5): one folder under experiments/ named ``b"bad\\xff"`` made every page
of the web dashboard answer 500 (Python lists such a name with a surrogate escape, ``"bad\\udcff"``, that no page,
log or JSON file can encode). Every backend now leaves such a name out of its listings with one WARNING that shows
it escaped (``bad\\xff``), so every reader, command and page answers as if it were not there: planted here as an
experiment folder, a worker's folder, a round folder and files inside a finished experiment, read through the
local folder and file:// (fsspec), and on Drive (the emulator) as a lone surrogate in the listing's JSON."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from faultkit import LAYOUT

from swarm_gdrive.config import env_fields
from swarm_gdrive.observe.monitor import list_experiments, load
from swarm_gdrive.storage import LocalStorage, open_storage

#: What a reader logs for a name that is not UTF-8 (the backends' WARNING, the name escaped).
LEFT_OUT = "left out of the listing: the name is not UTF-8"


def plant_names_not_utf8(folder: Path, experiment: str) -> list[bytes]:
    """Names that are not UTF-8 in ``folder`` (bytes paths: no ``str`` can name them): an experiment folder beside
    ``experiment`` holding a copy of its experiment.json, and inside ``experiment`` a worker's log folder, round
    folders, a stage folder and files where a reader lists (peers, rewards, rollouts, evals, state, logs, the
    experiment's top). Returns the planted paths, relative to ``folder``. The fault harness may call it on a live
    swarm's folder (``plant_names_not_utf8(folder, LAYOUT.experiment)``): no node or reader may fail for them."""
    base, root = os.fsencode(folder), os.fsencode(f"experiments/{experiment}")
    planted: list[bytes] = []

    def put(rel: bytes, data: bytes | None = None) -> None:
        path = os.path.join(base, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if data is None:
            os.makedirs(path, exist_ok=True)
        else:
            with open(path, "wb") as fh:
                fh.write(data)
        planted.append(rel)

    def copy(rel: str) -> bytes:
        try:
            with open(os.path.join(base, root, os.fsencode(rel)), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return b"{}"

    put(b"experiments/bad\xff/experiment.json", copy("experiment.json"))
    put(b"experiments/\xfe\xff")
    put(b"experiments/note\xff.json", b"{}")
    put(root + b"/logs/w\xff/metrics.jsonl", copy("logs/w1/metrics.jsonl"))
    put(root + b"/peers/w\xff.json", copy("peers/w1.json"))
    put(root + b"/peers/\xc3(.json", copy("peers/w1.json"))  # a truncated two-byte sequence
    put(root + b"/rewards/round_1\xff/stage_0/w1.json", copy("rewards/round_1/stage_0/w1.json"))
    put(root + b"/rewards/round_1/stage_0/w\xff.json", copy("rewards/round_1/stage_0/w1.json"))
    put(root + b"/rewards/round_1/stage_0\xff")
    put(root + b"/rollouts/round_1\xff/stage_0/w1.json", copy("rollouts/round_0/stage_0/w1.json"))
    put(root + b"/rollouts/round_0/stage_0/w\xff.json", copy("rollouts/round_0/stage_0/w1.json"))
    put(root + b"/evals/round_1\xff")
    put(root + b"/state/current_state.json\xff", copy("state/current_state.json"))
    put(root + b"/notes\xff.txt", b"x")
    return planted


@pytest.fixture(autouse=True)
def log_anew(monkeypatch):
    """Each test sees the WARNINGs its own listings give (they are said once per name and process)."""
    from swarm_gdrive.observe import monitor
    from swarm_gdrive.storage import base

    monkeypatch.setattr(base, "_unlisted", set(), raising=False)
    monkeypatch.setattr(monitor, "_not_experiments", set(), raising=False)


def clean_env() -> dict[str, str]:
    names = {f.metadata["env"] for f in env_fields()}
    return {k: v for k, v in os.environ.items() if k not in names}


def run_cli(*args: str) -> tuple[int, str, str]:
    """``swarm-gdrive ARGS`` in a fresh interpreter: its exit code, output and error output."""
    entry = "from swarm_gdrive.cli import main; main()"
    proc = subprocess.run(
        [sys.executable, "-c", entry, *args], capture_output=True, text=True, timeout=120, env=clean_env()
    )
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path]:
    """A finished experiment (2 workers, 2 rounds), and a copy of it with names that are not UTF-8 planted."""
    from swarm_threads import fast_env, run_threads

    base = tmp_path_factory.mktemp("utf8")
    clean = base / "clean"
    clean.mkdir()
    run_threads(fast_env(clean, LAYOUT.experiment, MIN_WORKERS=2, MAX_ROUNDS=2, NUM_TRANSPLANT_TREES=1), 2)
    hostile = base / "hostile"
    shutil.copytree(clean, hostile)
    assert len(plant_names_not_utf8(hostile, LAYOUT.experiment)) == 14
    return clean, hostile


def where(folder: Path, backend: str) -> str:
    return f"file://{folder}" if backend == "file" else str(folder)


@pytest.mark.parametrize("backend", ["local", "file"])
def test_listings_leave_the_names_out_and_the_monitor_reads_as_without_them(folders, backend, caplog):
    clean, hostile = folders
    storage, reference = open_storage(where(hostile, backend)), open_storage(where(clean, backend))
    with caplog.at_level("WARNING"):
        assert list_experiments(storage) == [LAYOUT.experiment]
        assert [i.name for i in storage.list(LAYOUT.peers_dir)] == ["coord.json", "w1.json", "w2.json"]
        assert [i.name for i in storage.list(f"{LAYOUT.rewards_dir}/round_1")] == ["stage_0"]
        snapshot, expected = load(storage, LAYOUT.experiment), load(reference, LAYOUT.experiment)
    assert snapshot.workers() == expected.workers() == ["w1", "w2"] and snapshot.problems == expected.problems
    assert snapshot.state.equals(expected.state) and snapshot.peers.equals(expected.peers)
    assert snapshot.rewards.equals(expected.rewards) and snapshot.metrics.shape == expected.metrics.shape
    said = [r.getMessage() for r in caplog.records if LEFT_OUT in r.getMessage()]
    for shown in ("experiments/bad\\xff", "experiments/\\xfe\\xff", f"{LAYOUT.peers_dir}/w\\xff.json"):
        assert any(m.startswith(f"{shown}: ") for m in said), (shown, said)
    assert all(m.isascii() for m in said), said
    assert len(said) == len(set(said))  # once per name: a poll meets the same name again and again


@pytest.mark.parametrize("backend", ["local", "file"])
def test_status_validate_report_and_compare_answer_as_without_the_names_and_log_them(folders, backend, tmp_path):
    clean, hostile = folders
    for args in (
        ["status", "--experiment"],
        ["validate", "--rounds", "2", "--nodes", "2", "--transplants", "1", "--experiment"],
        ["compare", LAYOUT.experiment, "--baseline"],
    ):
        expected, clean_out, _ = run_cli(*args, LAYOUT.experiment, "--folder", where(clean, backend))
        code, out, err = run_cli(*args, LAYOUT.experiment, "--folder", where(hostile, backend))
        assert (code, "Traceback" in err) == (expected, False), err
        assert expected == 0 and LEFT_OUT in err and "w\\xff.json" in err, (args, err)
        if args[0] == "status":  # heartbeat ages (and so the table's widths) and the folder's path differ between
            # the two: the rest may not
            out, clean_out = (
                [
                    re.sub(r" +", " ", re.sub(r"\d+ s ago", "N s ago", line))
                    for line in text.splitlines()
                    if "experiment_size" not in line
                ]
                for text in (out, clean_out)
            )
        assert out == clean_out, args

    report = ["report", "--out", str(tmp_path / "report"), "--experiment", LAYOUT.experiment]
    code, out, err = run_cli(*report, "--folder", where(hostile, backend))
    assert code == 0 and "Traceback" not in err and LEFT_OUT in err, err
    assert "<title>faults</title>" in (tmp_path / "report" / "index.html").read_text(encoding="utf-8")


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.mark.parametrize("backend", ["local", "file"])
def test_every_page_of_the_dashboard_answers_and_the_server_logs_the_names(folders, backend):
    _, hostile = folders
    server = subprocess.Popen(
        [sys.executable, "-m", "swarm_gdrive", "dashboard", "--folder", where(hostile, backend), "--port", "0"],
        env={**clean_env(), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        match = re.search(r"on (http://127\.0\.0\.1:\d+/)", line)
        assert match, line
        url = match.group(1)
        for page in ("", f"?experiment={LAYOUT.experiment}", f"experiment?name={LAYOUT.experiment}"):
            status, text = get(url + page)
            assert status == 200, (page, text[:500])
            assert f'<section data-experiment="{LAYOUT.experiment}"' in text, page
            assert re.findall(r'href="\?experiment=([^"]*)"', text) in ([LAYOUT.experiment], []), page  # the nav
        assert get(url + "?experiment=bad%FF")[0] == 404  # asked for by its bytes: no such experiment, a normal answer
        assert get(url + "experiment?name=bad%FF")[0] == 404
    finally:
        server.terminate()
        output = server.communicate(timeout=30)[0]
    assert "experiments/bad\\xff: " + LEFT_OUT in output and "Traceback" not in output, output


def test_a_live_swarm_runs_to_the_end_beside_the_names(tmp_path):
    """Planted while the swarm runs (once the workers have registered): every node lists past them to the end."""
    from swarm_threads import Node, fast_env

    folder = tmp_path / "drive"
    folder.mkdir()
    env = fast_env(folder, LAYOUT.experiment, MIN_WORKERS=2, MAX_ROUNDS=4, SYNTHETIC_STEP_SECONDS=0.3)
    nodes = [Node({**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord"})]
    nodes += [Node({**env, "NODE_ROLE": "worker", "NODE_ID": f"w{i}"}) for i in (1, 2)]
    for node in nodes:
        node.start()
    deadline = time.monotonic() + 60
    while not all((folder / LAYOUT.peer_file(w)).exists() for w in ("w1", "w2")) and time.monotonic() < deadline:
        time.sleep(0.05)
    plant_names_not_utf8(folder, LAYOUT.experiment)
    for node in nodes:
        node.join(120)
    assert [node.code for node in nodes] == [0, 0, 0]
    snapshot = load(LocalStorage(folder), LAYOUT.experiment)
    state = snapshot.state_record or {}
    assert (state.get("status"), state.get("round")) == ("finished", 4) and snapshot.workers() == ["w1", "w2"]


@pytest.mark.drive
def test_drive_leaves_a_lone_surrogate_out_of_its_listing(caplog):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from drive_emulator import DriveEmulator

    from swarm_gdrive.storage.drive import DriveStorage

    with DriveEmulator() as emu:
        folder = emu.create_duplicate_folder(emu.create_duplicate_folder(emu.root_id, "swarm"), "experiments")
        for name in ("bad\udcff", "\ud800", "good"):
            emu.create_duplicate_folder(folder, name)
        emu.create_file(folder, "w\udcff.json", b"{}")
        storage = DriveStorage(emu.root_id, "swarm", service=emu.service(), retry_max_wait=0.02)
        with caplog.at_level("WARNING"):
            assert [info.name for info in storage.list("experiments")] == ["good"]
    said = [r.getMessage() for r in caplog.records if LEFT_OUT in r.getMessage()]
    shown = {"experiments/bad\\xff", "experiments/\\ud800", "experiments/w\\xff.json"}
    assert {m.split(": ")[0] for m in said} == shown, said


def test_names_are_shown_escaped_and_a_folder_no_experiment_can_have_is_left_out(tmp_path, caplog):
    from swarm_gdrive.storage.base import escaped_name, listable_name

    assert escaped_name("bad\udcff") == "bad\\xff" and escaped_name("\ud800x") == "\\ud800x"
    assert escaped_name("r\u00e9sum\u00e9") == "r\u00e9sum\u00e9" and listable_name("e", "r\u00e9sum\u00e9")
    for name in ("My Run", "Exp", "e1"):
        (tmp_path / "experiments" / name).mkdir(parents=True)
    with caplog.at_level("WARNING"):
        assert list_experiments(LocalStorage(tmp_path)) == ["e1"]
        assert list_experiments(LocalStorage(tmp_path)) == ["e1"]
    said = [r.getMessage() for r in caplog.records if "not an experiment" in r.getMessage()]
    assert sorted(m.split(": ")[0] for m in said) == ["experiments/Exp", "experiments/My Run"], said  # once each


def test_the_planted_names_are_there_and_not_utf8(folders):
    """The control: the planting really holds names that are not UTF-8 (so the tests above can fail)."""
    _, hostile = folders
    names = os.listdir(os.fsencode(hostile / "experiments"))
    assert b"bad\xff" in names
    with pytest.raises(UnicodeEncodeError):
        os.fsdecode(b"bad\xff").encode("utf-8")
