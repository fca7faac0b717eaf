"""The experiment's size, its last hour's writes and the storage's room (observe/usage.py) in ``status``, the web
dashboard and the notebook dashboard; a warning when the room is down to a few checkpoints."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from swarm_gdrive.observe import usage
from swarm_gdrive.observe.monitor import findings, load
from swarm_gdrive.observe.web import Pages
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.storage.base import Space
from swarm_gdrive.storage.drive import DriveStorage
from swarm_gdrive.storage.local import LocalStorage
from tests.drive_emulator import DriveEmulator

EXPERIMENT = "sized"
LAYOUT = Layout(EXPERIMENT)
NOW = time.time()
#: path under the experiment -> (bytes, age in seconds)
FILES = {
    "checkpoints/w1/round_3/model.safetensors": (300_000, 7200),  # written two hours ago
    "checkpoints/w1/round_3/checkpoint.json": (1_000, 7200),
    "checkpoints/w1/round_7/model.safetensors": (400_000, 600),  # ten minutes ago
    "checkpoints/w1/round_7/checkpoint.json": (1_000, 600),
    "rollouts/round_7/stage_0/w1.json": (20_000, 300),
    "logs/w1/metrics.jsonl": (5_000, 60),
}


def write_experiment(root: Path) -> Path:
    for rel, (size, age) in FILES.items():
        path = root / LAYOUT.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
        os.utime(path, (NOW - age, NOW - age))
    return root


class NearlyFull(LocalStorage):
    """A local folder whose file system reports ``free`` bytes (a test double for a nearly full disk)."""

    def __init__(self, root: Path, free: int) -> None:
        super().__init__(root)
        self.free = free

    def free_space(self) -> Space:
        return Space(self.free, 10**9, f"the file system of {self.root}")


def test_the_walk_sizes_each_part_the_last_hour_and_the_largest_checkpoint(tmp_path: Path) -> None:
    measured = usage.measure(LocalStorage(write_experiment(tmp_path)), EXPERIMENT, NOW)
    assert measured.bytes == sum(size for size, _ in FILES.values()) and measured.files == len(FILES)
    assert measured.by_part == {"checkpoints": 702_000, "rollouts": 20_000, "logs": 5_000}
    assert measured.last_hour == 401_000 + 20_000 + 5_000  # not round 3's, two hours old
    assert measured.largest_checkpoint == 401_000 and measured.complete
    assert measured.space is not None and measured.space.free and measured.space.free > 0
    line = usage.describe(measured)
    assert "the experiment takes 727.0 KB in 6 file(s) (checkpoints 702.0 KB, rollouts 20.0 KB, logs 5.0 KB)" in line
    assert "426.0 KB written in the last hour" in line and f"the file system of {tmp_path}" in line


def test_a_walk_past_its_folder_budget_says_its_figures_are_lower_bounds(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(usage, "MAX_FOLDERS", 2)
    measured = usage.measure(LocalStorage(write_experiment(tmp_path)), EXPERIMENT, NOW)
    assert not measured.complete and measured.bytes < sum(size for size, _ in FILES.values())
    assert "takes at least" in usage.describe(measured)


def test_status_prints_the_size_and_the_last_hour(tmp_path: Path) -> None:
    write_experiment(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "swarm_gdrive", "status", "--folder", str(tmp_path), "--experiment", EXPERIMENT],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if "experiment_size" in x]
    assert line.startswith("INFO") and "727.0 KB" in line and "written in the last hour" in line


def test_the_dashboards_show_it_and_a_nearly_full_storage_is_a_warning(tmp_path: Path) -> None:
    write_experiment(tmp_path)
    roomy = {f.code: f for f in findings(load(NearlyFull(tmp_path, free=10**8), EXPERIMENT, now=NOW))}
    assert "experiment_size" in roomy and "storage_low" not in roomy
    storage = NearlyFull(tmp_path, free=3 * 401_000)
    found = {f.code: f for f in findings(load(storage, EXPERIMENT, now=NOW))}
    assert found["storage_low"].severity == "warning"
    assert "room for 3 more checkpoint(s) of 401.0 KB" in found["storage_low"].message
    page = Pages(storage, EXPERIMENT, refresh_s=5, liveness_timeout=120).part(EXPERIMENT)
    assert "experiment_size" in page and "storage_low" in page and "written in the last hour" in page
    dashboard = pytest.importorskip("swarm_gdrive.observe.dashboard")
    html = dashboard.findings_html(list(found.values()))
    assert "727.0 KB" in html and "storage_low" in html


def test_on_drive_it_reports_the_account_and_its_trash() -> None:
    with DriveEmulator() as emu:
        storage = DriveStorage(emu.root_id, "swarm", service=emu.service(), retry_max_wait=0.02, account="a@b.c")
        emu.set_storage_quota(15 * 10**9, used_elsewhere=5 * 10**9)
        storage.write_bytes(f"{LAYOUT.root}/checkpoints/w1/round_1/model.safetensors", b"m" * 50_000)
        storage.write_bytes(f"{LAYOUT.root}/logs/w1/metrics.jsonl", b"l" * 1_000)
        old = emu.create_file(emu.my_drive_id, "old.bin", b"t" * 2_000)  # outside the experiment, then trashed
        storage.service.files().update(fileId=old, body={"trashed": True}).execute()
        measured = usage.measure(storage, EXPERIMENT, time.time())
    assert measured.bytes == 51_000 and measured.last_hour == 51_000
    assert measured.space == Space(10 * 10**9 - 53_000, 15 * 10**9, "the Google Drive of a@b.c", trash=2_000)
    line = usage.describe(measured)
    assert "the Google Drive of a@b.c: 10.00 GB free of 15.00 GB, 2.0 KB of it in Drive's trash" in line


def test_a_live_dashboard_walks_the_folder_at_most_once_in_remeasure_seconds(tmp_path: Path, monkeypatch) -> None:
    """Every reload of a dashboard loads the experiment; the walk (a listing per folder, a Drive request each) runs
    once per REMEASURE_SECONDS for one storage object, and again after them, showing what changed."""
    storage = LocalStorage(write_experiment(tmp_path))
    walks = []
    real = usage.measure
    monkeypatch.setattr(usage, "measure", lambda *a, **k: walks.append(1) or real(*a, **k))
    clock = [1000.0]
    monkeypatch.setattr(usage, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    first = load(storage, EXPERIMENT, now=NOW).usage
    (tmp_path / Layout(EXPERIMENT).root / "logs" / "late.bin").write_bytes(b"x" * 7_000)
    clock[0] += usage.REMEASURE_SECONDS - 1
    assert load(storage, EXPERIMENT, now=NOW).usage == first and len(walks) == 1
    assert load(LocalStorage(tmp_path), EXPERIMENT, now=NOW).usage.bytes == first.bytes + 7_000  # another storage
    clock[0] += 2
    again = load(storage, EXPERIMENT, now=NOW).usage
    assert again.bytes == first.bytes + 7_000 and len(walks) == 3
