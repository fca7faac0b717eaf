"""The readers on a flooded folder (issue #30, class 6): what ``status``, ``validate``, ``report`` and the dashboard
read is bounded by the run's rounds, stages and nodes, not by what a participant of the folder planted, and the
run's own files are all still read. Counts, not times: ``python -m bench readers`` measures the times."""

from __future__ import annotations

import json
import shutil
import sys
import threading
from pathlib import Path

import pytest

from swarm_gdrive.observe import monitor, usage
from swarm_gdrive.observe.monitor import findings, load, status_table
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.storage import LocalStorage

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from swarm_threads import fast_env, run_threads  # noqa: E402

EXPERIMENT = "flood"
LAYOUT = Layout(EXPERIMENT)
PLANTED = 60
CAP = 20


class CountingStorage(LocalStorage):
    """A local folder that counts the reads and listings of each path (a test double)."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.reads: list[str] = []
        self.lists: list[str] = []
        self._lock = threading.Lock()

    def read_bytes(self, path, *args, **kwargs):
        with self._lock:
            self.reads.append(path)
        return super().read_bytes(path, *args, **kwargs)

    def list(self, folder, *args, **kwargs):
        with self._lock:
            self.lists.append(folder)
        return super().list(folder, *args, **kwargs)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("shared")
    run_threads(fast_env(folder, EXPERIMENT, MIN_WORKERS=2, MAX_ROUNDS=3, NUM_TRANSPLANT_TREES=1), 2)
    return folder


def _forge(folder: Path, template: str, target: str, node: str) -> None:
    """A valid copy of the run's own record ``template`` under ``target``, claiming to be ``node``."""
    record = json.loads((folder / template).read_bytes())
    record["node_id"] = node
    path = folder / target
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


@pytest.fixture
def flooded(finished, tmp_path) -> Path:
    """The finished run with ``PLANTED`` valid-looking records of planted nodes in each of a round's reward and
    rollout folders, an eval round, the peers folder and logs/ (a log folder each), and records in round and stage
    folders no node of a 3-round, 1-stage run writes."""
    folder = tmp_path / "flooded"
    shutil.copytree(finished, folder)
    reward, rollout, peer = LAYOUT.reward_file(1, 0, "w1"), LAYOUT.rollout_file(1, 0, "w1"), LAYOUT.peer_file("w1")
    for i in range(PLANTED):
        node = f"a-planted-{i:03d}"  # sorts before the run's own names
        _forge(folder, reward, LAYOUT.reward_file(1, 0, node), node)
        _forge(folder, rollout, LAYOUT.rollout_file(1, 0, node), node)
        _forge(folder, peer, LAYOUT.peer_file(node), node)
        _forge(folder, reward, LAYOUT.eval_file(3, node), node)
        (folder / LAYOUT.logs_dir(node)).mkdir(parents=True)
        shutil.copy(folder / LAYOUT.metrics_file("w1"), folder / LAYOUT.metrics_file(node))
    for round_, stage in ((7, 0), (500, 0), (1, 3)):
        _forge(folder, reward, LAYOUT.reward_file(round_, stage, "w1"), "w1")
        _forge(folder, rollout, LAYOUT.rollout_file(round_, stage, "w1"), "w1")
    return folder


def test_a_flooded_folder_is_read_within_bounds_and_the_run_s_own_files_all_are(flooded, monkeypatch):
    monkeypatch.setattr(monitor, "MAX_FILES_PER_FOLDER", CAP, raising=False)  # main: no cap
    storage = CountingStorage(flooded)
    snap = load(storage, EXPERIMENT)

    for folder in (LAYOUT.rewards_stage_dir(1, 0), LAYOUT.rollouts_stage_dir(1, 0), LAYOUT.peers_dir):
        read = [p for p in storage.reads if p.rsplit("/", 1)[0] == folder]
        assert len(read) <= CAP, (folder, len(read))
        own = 3 if folder == LAYOUT.peers_dir else 2  # the coordinator's peer file, each worker's
        assert any(p.startswith(f"{folder}: {PLANTED + own - CAP} more file(s) not examined") for p in snap.problems)
    assert len([p for p in storage.reads if "/evals/round_3/" in p]) <= CAP
    assert len({p.split("/")[3] for p in storage.reads if p.startswith(f"{LAYOUT.logs_root}/")}) <= CAP
    assert any(p.startswith(f"{LAYOUT.logs_root}: {PLANTED + 3 - CAP} more") for p in snap.problems)
    # Round and stage folders past the state's max_rounds and num_stages are not read (the size walk lists them).
    for far in ("round_7/", "round_500/", "round_1/stage_3/"):
        assert not [p for p in storage.reads if far in p]
    assert any("round folder(s) past the state's max_rounds (3) not examined" in p for p in snap.problems)
    assert any("stage folder(s) past the state's num_stages (1) not examined" in p for p in snap.problems)

    # The run's own files come first: every reward, rollout and peer of w1, w2 and the coordinator is there.
    own = snap.rewards[snap.rewards["node"].isin(["w1", "w2"])]
    assert sorted(zip(own["node"], own["round"], strict=True)) == [(w, r) for w in ("w1", "w2") for r in range(3)]
    rollouts = snap.rollouts_per_round
    assert {(w, r) for w in ("w1", "w2") for r in range(3)} <= set(
        zip(rollouts["node"], rollouts["round"], strict=True)
    )
    assert {"coord", "w1", "w2"} <= set(snap.peers["node"])
    assert {"coord", "w1", "w2"} <= set(snap.metrics["node"]) and {"w1", "w2"} <= set(snap.log_files)
    assert status_table(snap)  # and the readers still render it
    assert [f for f in findings(snap) if f.code == "unreadable"]


def test_the_size_walk_stops_at_its_entry_budget_and_says_its_figures_are_lower_bounds(flooded, monkeypatch):
    monkeypatch.setattr(usage, "MAX_ENTRIES", 50, raising=False)
    measured = usage.measure(LocalStorage(flooded), EXPERIMENT, now=0.0)
    assert not measured.complete and "at least" in usage.describe(measured)
    monkeypatch.setattr(usage, "MAX_ENTRIES", 10**9, raising=False)
    assert usage.measure(LocalStorage(flooded), EXPERIMENT, now=0.0).complete


def test_a_swarm_larger_than_the_cap_is_read_whole_and_only_unknown_names_are_capped():
    """Review of issue 30 class 6: with 300 known workers the cap of 256 left 45 real workers out of status and the
    dashboard; the known nodes are now all read, and only names no state or peer record gives are capped."""
    from swarm_gdrive.observe.monitor import Bounds
    from swarm_gdrive.storage import FileInfo

    known = {f"worker-{i:03d}" for i in range(300)} | {"zz-coordinator"}
    planted = {f"planted-{i:04d}" for i in range(1000)}
    entries = {node: FileInfo(name=f"{node}.json", is_dir=False, size=10, mtime=0.0) for node in known | planted}
    bounds = Bounds(first=known, per_folder=256)
    picked = bounds.pick("peers", entries)
    assert known <= set(picked)
    assert not set(picked) & planted
    assert bounds.problems and "1000 more file(s) not examined" in bounds.problems[0]
    few = Bounds(first={"w1", "w2"}, per_folder=4)
    picked = few.pick("peers", {n: entries.get(n) or entries["worker-000"] for n in ["w1", "w2", "a", "b", "c"]})
    assert set(picked) == {"w1", "w2", "a", "b"} and "1 more file(s)" in few.problems[0]
