"""The lagged-mount double itself: late, reordered, temporary-then-rename deliveries, late deletions, freezing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from lagged_mount import Lag, LaggedMount

from swarm_gdrive.storage import LocalStorage
from swarm_gdrive.storage.base import is_temporary


def wait_for_file(path: Path, timeout: float, exists: bool = True) -> float:
    """Seconds until ``path`` exists (or is gone); fails after ``timeout``."""
    start = time.monotonic()
    while path.exists() != exists:
        assert time.monotonic() - start < timeout, f"{path} {'never came' if exists else 'never went'}"
        time.sleep(0.005)
    return time.monotonic() - start


def write(folder: Path, rel: str, data: bytes) -> None:
    LocalStorage(folder).write_bytes(rel, data)


def test_a_write_reaches_the_others_late_first_under_a_temporary_name(tmp_path):
    lags = {"a": Lag(0.0, 0.1), "b": Lag(0.6, 0.8), "c": Lag(0.3, 0.4)}
    with LaggedMount(tmp_path, lags, seed=1, temp_share=0.9) as mount:
        write(mount.replica("a"), "x/f.json", b"one")
        for node in ("c", "b"):
            folder = mount.replica(node) / "x"
            start = time.monotonic()
            while not (folder.exists() and any(is_temporary(p.name) for p in folder.iterdir())):
                assert not (folder / "f.json").exists(), "the final name came without a temporary first"
                assert time.monotonic() - start < 5
                time.sleep(0.002)
            assert LocalStorage(mount.replica(node)).list("x") == []  # readers never see the temporary
            wait_for_file(folder / "f.json", 5)
            assert (folder / "f.json").read_bytes() == b"one"
        summary = mount.summary()
    for node in ("b", "c"):
        delivered = summary["per_destination"][node]
        assert lags[node].low - 0.01 <= delivered["delay_max"] <= lags[node].high + 0.2, delivered
    assert summary["temporaries_shown"] == 2 and summary["outcomes"] == {"delivered": 2}
    assert [p.name for p in (mount.replica("b") / "x").iterdir()] == ["f.json"]  # the temporary became it
    assert not summary["errors"]


def test_files_appear_out_of_order_and_the_newest_version_wins(tmp_path):
    with LaggedMount(tmp_path, {"a": Lag(0, 0), "b": Lag(0.0, 1.0)}, seed=3) as mount:
        for i in range(12):
            write(mount.replica("a"), f"r/f{i}.json", str(i).encode())
            write(mount.replica("a"), "r/same.json", f"version {i}".encode())
            time.sleep(0.08)  # longer than a scan: every version is seen
        wait_for_file(mount.replica("b") / "r" / "f11.json", 5)
        time.sleep(1.2)
        summary = mount.summary()
    held = mount.replica("b") / "r"
    assert sorted(p.name for p in held.iterdir() if not is_temporary(p.name)) == sorted(
        [f"f{i}.json" for i in range(12)] + ["same.json"]
    )
    assert (held / "same.json").read_bytes() == b"version 11"  # an older version arriving late never wins
    assert summary["reordered"] > 0
    assert summary["outcomes"].get("superseded", 0) > 0
    assert not [p for p in held.iterdir() if is_temporary(p.name)]


def test_a_deletion_is_seen_late(tmp_path):
    with LaggedMount(tmp_path, {"a": Lag(0, 0), "b": Lag(0.5, 0.6)}, seed=2) as mount:
        write(mount.replica("a"), "d/f.json", b"x")
        wait_for_file(mount.replica("b") / "d" / "f.json", 5)
        (mount.replica("a") / "d" / "f.json").unlink()
        gone = wait_for_file(mount.replica("b") / "d" / "f.json", 5, exists=False)
        summary = mount.summary()
    assert gone >= 0.4
    assert summary["deletions_delivered"] == 1


def test_a_frozen_node_gets_nothing_more_but_its_own_last_changes_go_out(tmp_path):
    with LaggedMount(tmp_path, {"a": Lag(0, 0.05), "b": Lag(0, 0.05)}, seed=4) as mount:
        mount.freeze("b")
        write(mount.replica("a"), "f/from-a.json", b"a")
        write(mount.replica("b"), "f/from-b.json", b"b")
        wait_for_file(mount.replica("a") / "f" / "from-b.json", 5)
        time.sleep(0.3)
        summary = mount.summary()
    assert not (mount.replica("b") / "f" / "from-a.json").exists()
    assert summary["outcomes"] == {"frozen": 1, "delivered": 1}


def test_delays_are_drawn_from_the_seed(tmp_path):
    def delays(folder: Path, seed: int) -> list[float]:
        with LaggedMount(folder, {"a": Lag(0, 0), "b": Lag(0, 50), "c": Lag(10, 20)}, seed=seed) as mount:
            for i in range(3):
                write(mount.replica("a"), f"s/f{i}.json", b"x")
                time.sleep(0.1)
        return [round(d.due_at - d.seen_at, 9) for d in mount.deliveries]

    first = delays(tmp_path / "1", 7)
    assert len(first) == 6 and all(0 <= d <= 50 for d in first)
    assert first == delays(tmp_path / "2", 7)
    assert first != delays(tmp_path / "3", 8)


def test_a_bad_lag_is_refused():
    with pytest.raises(ValueError, match="low=2"):
        Lag(2, 1)
