"""The folder's layout subverted under a running swarm of real processes: symbolic links planted at every level
(a log folder, a round folder, a node's log file itself, a link to a folder outside, a dangling link), and type
confusion in the writers' own paths (a file where a round folder belongs, a folder where a peer file, a log or
the state belongs, a file inside an old round folder that cleanup prunes). Nothing is written outside the root,
no node exits 1, every round is submitted, and each node says what it removed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from faultkit import (
    LAYOUT,
    Swarm,
    Watcher,
    assert_every_round_submitted,
    assert_swarm_finished,
    events,
    leftovers,
    metrics,
    rewards_present,
    swarm_env,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WORKERS = ["w1", "w2"]


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry under ``folder`` (links as their target, never followed) with its bytes."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(dirpath, name)
            rel = str(path.relative_to(folder))
            out[rel] = f"-> {os.readlink(path)}" if path.is_symlink() else (b"" if path.is_dir() else path.read_bytes())
    return out


def links_under(folder: Path) -> list[str]:
    found = []
    for dirpath, dirs, files in os.walk(folder):
        found += [str(Path(dirpath, n).relative_to(folder)) for n in dirs + files if Path(dirpath, n).is_symlink()]
    return found


def said(swarm: Swarm, text: str) -> list[str]:
    return [f"{p.name}: {line}" for p in swarm.procs for line in p.lines if text in line]


def start_coordinator(swarm: Swarm, folder: Path) -> None:
    swarm.start("coord")
    wait_until((folder / LAYOUT.experiment_file).exists, 60, "experiment.json", swarm.procs)


def test_links_planted_at_every_level_are_never_followed_and_the_swarm_goes_on(tmp_path):
    folder, outside = tmp_path / "drive", tmp_path / "outside"
    folder.mkdir()
    (outside / "round_1" / "stage_0").mkdir(parents=True)
    (outside / "secret.json").write_bytes(b"the attacker's target")
    swarm = Swarm(folder, swarm_env(folder, MAX_ROUNDS=4, MIN_WORKERS=2), WORKERS)
    before = snapshot(tmp_path / "outside")
    planted: set[str] = set()
    watcher = Watcher(folder, planted)
    links = {
        f"{LAYOUT.root}/logs/w1": outside,  # a log folder: w1's metrics and events would land outside
        LAYOUT.events_file("w2"): outside / "secret.json",  # a log file itself: appended to, outside
        # Round folders the coordinator has not made yet (it makes round R + 2's when R opens, rounds 0 to 2 at its
        # start); it refuses the links, and each writer replaces them in its own path.
        LAYOUT.rollouts_round_dir(3): outside,  # a round folder: every worker's rollouts of round 3
        LAYOUT.rewards_dir + "/round_3": tmp_path / "nowhere",  # a dangling link: would be created outside
    }
    try:
        start_coordinator(swarm, folder)
        for rel, target in links.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(target, folder / rel)
        planted.update(links)
        watcher.start()
        for w in WORKERS:
            swarm.start(w)
        codes = swarm.wait(timeout=180)
    finally:
        swarm.stop()
        watcher.stop()

    assert codes == {"coord": 0, "w1": 0, "w2": 0}, swarm.tails()
    assert snapshot(tmp_path / "outside") == before, "bytes were written outside GDRIVE_PATH"
    assert not (tmp_path / "nowhere").exists()
    assert not links_under(folder), links_under(folder)  # each writer replaced the link in its own path
    watcher.assert_clean()
    assert_swarm_finished(folder, 4)
    assert not leftovers(folder)
    for w in WORKERS:
        assert_every_round_submitted(folder, w, range(4))
        assert events(folder, w) and metrics(folder, w)  # the logs are whole, inside the root
    removed = said(swarm, "removed a symbolic link")
    for rel, target in links.items():
        assert any(f"to {str(target)!r} at {rel}: it blocked writing" in line for line in removed), (rel, removed)


def test_a_writer_whose_own_path_is_blocked_clears_it_and_cleanup_tolerates_type_confusion(tmp_path):
    folder = tmp_path / "drive"
    folder.mkdir()
    env = swarm_env(folder, MAX_ROUNDS=4, MIN_WORKERS=2, ROLLOUT_CLEANUP_ENABLED="true", ROLLOUT_KEEP_LAST_N_ROUNDS=1)
    swarm = Swarm(folder, env, WORKERS)
    planted: set[str] = set()
    watcher = Watcher(folder, planted)
    blocked = {  # round folders the coordinator has not made yet (rounds 0 to 2 exist from its start)
        LAYOUT.rewards_dir + "/round_3": "a file",  # where every worker's reward folder of round 3 belongs
        LAYOUT.rollouts_round_dir(3): "a file",  # where every worker publishes in round 3
        LAYOUT.peer_file("w2"): "a folder",  # w2's own peer file: a folder with a file in it
        LAYOUT.metrics_file("w1"): "a folder",  # w1's own log
        LAYOUT.rollouts_stage_dir(0, 7): "a file",  # inside round 0, which cleanup prunes: a file, not a folder
        LAYOUT.state_file: "a folder",  # while the swarm waits for its workers: the coordinator's next write clears it
    }
    try:
        start_coordinator(swarm, folder)
        # experiment.json comes first, the state a moment later: the state is swapped for a folder once it is there
        wait_until((folder / LAYOUT.state_file).exists, 60, "the state file", swarm.procs)
        for rel, kind in blocked.items():
            path = folder / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if rel == LAYOUT.state_file:
                swap_for_a_folder(path)
            elif kind == "a file":
                path.write_bytes(b"planted")
            else:
                (path / "inside").mkdir(parents=True)
                (path / "inside" / "x.json").write_bytes(b"planted")
                planted.add(f"{rel}/inside/x.json")
        planted.update(set(blocked) - {LAYOUT.state_file})
        watcher.start()
        for w in WORKERS:
            swarm.start(w)
        codes = swarm.wait(timeout=180)
    finally:
        swarm.stop()
        watcher.stop()

    assert codes == {"coord": 0, "w1": 0, "w2": 0}, swarm.tails()
    watcher.assert_clean()
    assert_swarm_finished(folder, 4)
    for w in WORKERS:  # every reward is there; cleanup removed the rollouts of all but the last round
        assert sorted(rewards_present(folder, w)) == [0, 1, 2, 3]
        assert_every_round_submitted(folder, w, range(3, 4))
        assert metrics(folder, w)
    removed = said(swarm, "it blocked writing")
    for rel, kind in blocked.items():
        if rel != LAYOUT.rollouts_stage_dir(0, 7):
            assert any(f"removed {kind} at {rel}: it blocked writing" in line for line in removed), (rel, removed)
    # pruning said it and went on: the coordinator's exchange rejects the file as not a folder, and leaves it
    left = said(swarm, f"rejected {LAYOUT.rollouts_stage_dir(0, 7)}: not a folder")
    assert left and any(line.startswith("coord: ") for line in left), left  # workers' cleanup may say it too
    assert (folder / LAYOUT.rollouts_stage_dir(0, 7)).read_bytes() == b"planted"  # not the pruner's to delete
    assert not said(swarm, "Traceback")


def swap_for_a_folder(path: Path) -> None:
    """Put a folder where the file ``path`` is (its writer may rename a new one into place meanwhile)."""
    for _ in range(50):
        os.replace(path, path.with_name("gone.tmp"))
        try:
            (path / "inside").mkdir(parents=True)
            return
        except (FileExistsError, NotADirectoryError):  # the writer was quicker: again
            continue
    raise AssertionError(f"could not put a folder at {path}")
