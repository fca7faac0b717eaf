"""LocalStorage never follows a symbolic link under its root, and a writer whose own path is blocked (a link, a
file where a folder belongs, a folder where its file belongs) clears it and writes: nothing is ever read or
written outside the root, whatever is planted, at whatever level, even while it is being swapped."""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path

import pytest

from swarm_gdrive.storage import local as local_module
from swarm_gdrive.storage.base import LinkRefusedError, NotRegularFileError, PathBlockedError, StorageError
from swarm_gdrive.storage.local import LocalStorage

EXP = "experiments/e"


@pytest.fixture(autouse=True)
def fresh_warnings():
    local_module._warned.clear()  # warnings are once per path and process: each test sees its own


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "root").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_bytes(b"outside")
    (outside / "round_1" / "stage_0").mkdir(parents=True)
    (outside / "round_1" / "stage_0" / "w2.json").write_bytes(b"outside rollout")
    return tmp_path / "root"


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry under ``folder``, links as their target (never followed): what must not change outside."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(dirpath, name)
            rel = str(path.relative_to(folder))
            out[rel] = f"-> {os.readlink(path)}" if path.is_symlink() else (b"" if path.is_dir() else path.read_bytes())
    return out


def links_under(folder: Path) -> list[str]:
    return [
        str(Path(d, n).relative_to(folder)) for d, ds, fs in os.walk(folder) for n in ds + fs if Path(d, n).is_symlink()
    ]


def plant_link(root: Path, rel: str, target: Path | str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)


#: Where a link is planted, and a path through it (or at it) that the node reads and writes.
LEVELS = {
    "a log folder": ("logs/w1", "logs/w1/training_events.jsonl"),
    "a round folder": ("rollouts/round_1", "rollouts/round_1/stage_0/w2.json"),
    "the file itself": ("logs/w1/training_events.jsonl", "logs/w1/training_events.jsonl"),
    "the experiment folder": ("", "state/current_state.json"),
}


def link_target(outside: Path, level: str) -> Path:
    return outside / "secret.json" if level == "the file itself" else outside


@pytest.mark.parametrize("level", list(LEVELS))
@pytest.mark.parametrize("dangling", [False, True], ids=["to-outside", "dangling"])
def test_readers_refuse_a_link_at_any_level_and_read_nothing_outside(root: Path, level: str, dangling: bool) -> None:
    link, rel = LEVELS[level]
    outside = root.parent / "outside"
    plant_link(root, f"{EXP}/{link}".rstrip("/"), root.parent / "nowhere" if dangling else link_target(outside, level))
    storage = LocalStorage(root)
    with pytest.raises(LinkRefusedError) as info:
        storage.read_bytes(f"{EXP}/{rel}")
    where = f"{EXP}/{link}".rstrip("/")
    assert info.value.link == where and info.value.path == f"{EXP}/{rel}"
    assert f"{where} is a symbolic link" in str(info.value)
    assert isinstance(info.value, NotRegularFileError)  # readers already turn it into a rejection with a reason
    assert info.value.what == ("a symbolic link" if where == f"{EXP}/{rel}" else f"under the symbolic link {where}")
    assert storage.list(where) == []  # a listing of (or under) a link finds nothing; a link is listed as no folder
    assert [(i.name, i.is_dir) for i in storage.list(f"{EXP}/{rel}".rsplit("/", 1)[0])] == (
        [("training_events.jsonl", False)] if level == "the file itself" else []
    )


@pytest.mark.parametrize("level", list(LEVELS))
@pytest.mark.parametrize("dangling", [False, True], ids=["to-outside", "dangling"])
def test_writers_replace_a_link_in_their_own_path_and_write_inside(
    root: Path, level: str, dangling: bool, caplog: pytest.LogCaptureFixture
) -> None:
    link, rel = LEVELS[level]
    outside = root.parent / "outside"
    before = snapshot(root.parent)
    target = root.parent / "nowhere" if dangling else link_target(outside, level)
    plant_link(root, f"{EXP}/{link}".rstrip("/"), target)
    storage = LocalStorage(root)
    with caplog.at_level(logging.WARNING, logger="swarm_gdrive.storage.local"):
        storage.append_bytes(f"{EXP}/{rel}", b"appended\n")
        storage.write_bytes(f"{EXP}/{rel}.json", b"written")
        storage.append_bytes(f"{EXP}/{rel}", b"again\n")
    assert (root / EXP / rel).read_bytes() == b"appended\nagain\n"
    assert (root / EXP / f"{rel}.json").read_bytes() == b"written"
    assert not links_under(root)
    after = snapshot(root.parent)
    assert {k: v for k, v in after.items() if not k.startswith("root")} == {
        k: v for k, v in before.items() if not k.startswith("root")
    }  # not a byte outside the root
    assert not (root.parent / "nowhere").exists()
    removed = [r.getMessage() for r in caplog.records if "removed a symbolic link" in r.getMessage()]
    assert len(removed) == 1 and f"to {str(target)!r} at {EXP}/{link}".rstrip("/") in removed[0], removed


def test_delete_rmdir_and_move_never_act_through_a_link(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    outside = root.parent / "outside"
    before = snapshot(outside)
    plant_link(root, f"{EXP}/rollouts/round_1", outside)
    plant_link(root, f"{EXP}/rewards/round_1", outside / "round_1")
    storage = LocalStorage(root)
    with caplog.at_level(logging.WARNING, logger="swarm_gdrive.storage.local"):
        storage.delete(f"{EXP}/rollouts/round_1/secret.json")  # would delete outside/secret.json through the link
        storage.delete(f"{EXP}/rollouts/round_1/round_1/stage_0/w2.json")
        assert storage.remove_empty_dir(f"{EXP}/rewards/round_1/stage_0") is False
        assert storage.remove_empty_dir(f"{EXP}/rewards/round_1") is False  # a link is not a folder: left
        with pytest.raises(LinkRefusedError):
            storage.move(f"{EXP}/rollouts/round_1/secret.json", f"{EXP}/stolen.json")
    assert snapshot(outside) == before
    assert not (root / EXP / "stolen.json").exists()
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "not deleted: experiments/e/rollouts/round_1 is a symbolic link" in said
    assert "not removed: experiments/e/rewards/round_1 is a symbolic link" in said

    storage.write_bytes(f"{EXP}/peers/w1.json", b"mine")  # moving onto a path through a link: replaced, inside
    plant_link(root, f"{EXP}/archives", outside)
    storage.move(f"{EXP}/peers/w1.json", f"{EXP}/archives/w1.json")
    assert (root / EXP / "archives" / "w1.json").read_bytes() == b"mine" and snapshot(outside) == before


def test_a_link_as_the_root_is_resolved_once_and_works(tmp_path: Path) -> None:
    """GDRIVE_PATH may be a link (Colab's /content/drive, a Drive for desktop folder); only links under it are not."""
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "drive")
    storage = LocalStorage(tmp_path / "drive")
    storage.write_bytes(f"{EXP}/state/current_state.json", b"{}")
    assert storage.read_bytes(f"{EXP}/state/current_state.json") == b"{}"
    assert (real / EXP / "state" / "current_state.json").read_bytes() == b"{}"
    assert storage.describe() == f"local folder {real}"


def test_a_link_swapped_in_while_writing_never_receives_a_byte(root: Path) -> None:
    """The race a check-then-use implementation loses: a component flips between a folder and a link to a folder
    outside while a writer appends and replaces files under it. Every component is opened with O_NOFOLLOW from
    its parent's descriptor, so the link is refused or replaced, never followed."""
    outside = root.parent / "outside"
    before = snapshot(outside)
    storage = LocalStorage(root, retry_attempts=1)
    flip = root / EXP / "logs" / "w1"
    flip.parent.mkdir(parents=True)
    stop = threading.Event()
    swaps = [0]

    def swapper() -> None:
        while not stop.is_set():
            try:
                if flip.is_symlink():
                    flip.unlink()
                elif flip.is_dir():
                    for child in flip.iterdir():
                        child.unlink()
                    flip.rmdir()
                os.symlink(outside, flip)
                swaps[0] += 1
            except OSError:
                pass

    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    done, refused = 0, 0
    try:
        for i in range(1500):
            try:
                storage.append_bytes(f"{EXP}/logs/w1/metrics.jsonl", b"line\n")
                storage.write_bytes(f"{EXP}/logs/w1/secret.json", b"overwritten %d" % i)
                done += 1
            except (StorageError, FileNotFoundError):  # lost every round against the swapper: said, not followed
                refused += 1
    finally:
        stop.set()
        thread.join(5)
    assert swaps[0] > 100 and done > 0, (swaps, done, refused)
    assert snapshot(outside) == before


# -- a writer's own path blocked by something that is not a folder, or not a file ------------------------------------


def test_a_file_where_a_folder_belongs_is_cleared_for_a_writer_and_absent_for_a_reader(root: Path) -> None:
    storage = LocalStorage(root)
    (root / EXP / "rewards").mkdir(parents=True)
    (root / EXP / "rewards" / "round_3").write_bytes(b"planted")
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(f"{EXP}/rewards/round_3/stage_0/w1.json")
    assert storage.list(f"{EXP}/rewards/round_3/stage_0") == []
    storage.delete(f"{EXP}/rewards/round_3/stage_0/w1.json")  # nothing there to delete
    assert storage.remove_empty_dir(f"{EXP}/rewards/round_3") is False  # a file is not a folder: left
    storage.write_bytes(f"{EXP}/rewards/round_3/stage_0/w1.json", b"reward")
    assert (root / EXP / "rewards/round_3/stage_0/w1.json").read_bytes() == b"reward"


@pytest.mark.parametrize("blocker", ["a folder", "a non-empty tree", "a FIFO", "a link to a folder"])
def test_what_sits_at_a_writers_own_file_is_removed(root: Path, blocker: str, caplog: pytest.LogCaptureFixture) -> None:
    storage = LocalStorage(root)
    own = root / EXP / "peers" / "w1.json"
    own.parent.mkdir(parents=True)
    if blocker == "a folder":
        own.mkdir()
    elif blocker == "a non-empty tree":
        (own / "a" / "b").mkdir(parents=True)
        (own / "a" / "b" / "x.json").write_bytes(b"x")
        os.symlink(root.parent / "outside", own / "a" / "link")  # removed as a link, its target untouched
    elif blocker == "a FIFO":
        os.mkfifo(own)
    else:
        os.symlink(root.parent / "outside", own)
    before = snapshot(root.parent / "outside")
    with caplog.at_level(logging.WARNING, logger="swarm_gdrive.storage.local"):
        storage.write_bytes(f"{EXP}/peers/w1.json", b"peer")
        storage.append_bytes(f"{EXP}/peers/w1.json.log", b"x")  # a fresh name: nothing in the way
    assert own.read_bytes() == b"peer" and snapshot(root.parent / "outside") == before
    assert any(f"at {EXP}/peers/w1.json: it blocked writing" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("blocker", ["a folder", "a FIFO", "a link to a file outside"])
def test_what_sits_at_a_writers_own_log_is_removed(root: Path, blocker: str) -> None:
    storage = LocalStorage(root)
    log = root / EXP / "logs" / "w1" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    if blocker == "a folder":
        (log / "sub").mkdir(parents=True)
    elif blocker == "a FIFO":
        os.mkfifo(log)
    else:
        os.symlink(root.parent / "outside" / "secret.json", log)
    storage.append_bytes(f"{EXP}/logs/w1/metrics.jsonl", b"line\n")
    assert log.read_bytes() == b"line\n" and (root.parent / "outside" / "secret.json").read_bytes() == b"outside"


def test_type_confusion_in_delete_and_rmdir_is_left_and_said(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    storage = LocalStorage(root)
    (root / EXP / "rollouts" / "round_0" / "stage_0.json").mkdir(parents=True)
    (root / EXP / "rollouts" / "round_0" / "stage_1").write_bytes(b"a file")
    with caplog.at_level(logging.WARNING, logger="swarm_gdrive.storage.local"):
        storage.delete(f"{EXP}/rollouts/round_0/stage_0.json")  # a folder where a file belongs
        assert storage.remove_empty_dir(f"{EXP}/rollouts/round_0/stage_1") is False  # a file where a folder belongs
    assert (root / EXP / "rollouts" / "round_0" / "stage_0.json").is_dir()
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "stage_0.json: not deleted: a folder where a file belongs" in said
    assert "stage_1: not removed: a file where a folder belongs" in said


def test_a_blocker_too_deep_to_remove_is_a_path_blocked_error_naming_it(root: Path) -> None:
    storage = LocalStorage(root)
    deep = root / EXP / "peers" / "w1.json"
    deep.joinpath(*["d"] * 40).mkdir(parents=True)
    with pytest.raises(PathBlockedError) as info:
        storage.write_bytes(f"{EXP}/peers/w1.json", b"peer")
    assert str(info.value).startswith(f"{EXP}/peers/w1.json: not written: {EXP}/peers/w1.json is a folder too large")
    assert "remove experiments/e/peers/w1.json by hand" in str(info.value)
    assert not [p for p in (root / EXP / "peers").iterdir() if p.name != "w1.json"]  # no temporary left


def test_a_socket_is_not_read(root: Path) -> None:
    import socket

    path = root / EXP / "peers" / "s.json"
    path.parent.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        with pytest.raises(NotRegularFileError) as info:
            LocalStorage(root).read_bytes(f"{EXP}/peers/s.json")
    assert info.value.what == "a socket"


def test_refusals_are_not_retried(root: Path) -> None:
    plant_link(root, f"{EXP}/logs/w1", root.parent / "outside")
    storage = LocalStorage(root, retry_attempts=8, retry_max_wait=5)
    for _ in range(20):  # 20 refusals, each at once: none waits in backoff
        with pytest.raises(LinkRefusedError):
            storage.read_bytes(f"{EXP}/logs/w1/metrics.jsonl")
    assert errno.ELOOP not in local_module.TRANSIENT_ERRNOS


def test_two_writers_clearing_the_same_link_both_write(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers met one planted link at rollouts/round_1: the first removed it and made the folder, the second's
    unlink then met that folder (EISDIR) and it exited 1 (seen in CI). The second must look again and write."""
    outside = root.parent / "outside"
    (root / "round_1").symlink_to(outside / "round_1", target_is_directory=True)
    real_unlink = os.unlink

    def racing_unlink(name, *, dir_fd=None):  # the other writer wins between our look and our unlink
        real_unlink(name, dir_fd=dir_fd)
        os.mkdir(name, 0o755, dir_fd=dir_fd)
        (root / "round_1" / "stage_0").mkdir()
        raise IsADirectoryError(errno.EISDIR, "Is a directory")

    monkeypatch.setattr(local_module.os, "unlink", racing_unlink)
    LocalStorage(root).write_bytes("round_1/stage_0/w2.json", b"{}")
    monkeypatch.undo()
    assert (root / "round_1" / "stage_0" / "w2.json").read_bytes() == b"{}"
    assert not (root / "round_1").is_symlink()
    assert (outside / "round_1" / "stage_0" / "w2.json").read_bytes() == b"outside rollout"


def test_a_write_whose_temporary_vanishes_writes_again(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second process with the same NODE_ID removed 'its' leftover temporaries while the first was writing: the
    first's rename found no temporary and it exited 1 (seen in CI). The write starts again instead."""
    real_replace = os.replace
    calls = []

    def vanishing_replace(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
        calls.append(src)
        if len(calls) == 1:
            os.unlink(src, dir_fd=src_dir_fd)  # the twin's cleanup, between our write and our rename
        return real_replace(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    monkeypatch.setattr(local_module.os, "replace", vanishing_replace)
    LocalStorage(root).write_bytes("peers/w1.json", b'{"ok": 1}')
    monkeypatch.undo()
    assert (root / "peers" / "w1.json").read_bytes() == b'{"ok": 1}'
    assert len(calls) == 2 and calls[0] != calls[1]
    assert [p.name for p in (root / "peers").iterdir()] == ["w1.json"]


@pytest.mark.parametrize("level", list(LEVELS))
def test_a_file_moved_in_replaces_a_link_in_its_path_and_lands_inside(root: Path, level: str) -> None:
    """``move_in`` (a checkpoint's files renamed into the folder) clears what sits in its path as write_bytes does:
    a link at any level is replaced, never followed, and the file lands inside the root."""
    link, rel = LEVELS[level]
    before = snapshot(root.parent)
    plant_link(root, f"{EXP}/{link}".rstrip("/"), link_target(root.parent / "outside", level))
    own = root.parent / "own"
    own.mkdir()
    (own / "model.safetensors").write_bytes(b"weights")
    assert LocalStorage(root).move_in(f"{EXP}/{rel}", own / "model.safetensors")
    assert (root / EXP / rel).read_bytes() == b"weights" and not links_under(root)
    after = snapshot(root.parent)
    assert {k: v for k, v in after.items() if k.startswith("outside")} == {
        k: v for k, v in before.items() if k.startswith("outside")
    }  # not a byte outside the root


def test_a_file_moved_in_over_a_planted_hard_link_leaves_its_other_name_untouched(root: Path) -> None:
    victim = root.parent / "outside" / "secret.json"
    (root / EXP).mkdir(parents=True)
    os.link(victim, root / EXP / "model.safetensors")
    own = root.parent / "own"
    own.mkdir()
    (own / "model.safetensors").write_bytes(b"weights")
    assert LocalStorage(root).move_in(f"{EXP}/model.safetensors", own / "model.safetensors")
    assert (root / EXP / "model.safetensors").read_bytes() == b"weights"
    assert victim.read_bytes() == b"outside" and victim.stat().st_nlink == 1
