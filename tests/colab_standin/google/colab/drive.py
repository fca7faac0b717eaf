"""Stand-in for ``google.colab.drive``: the mountpoint becomes a symbolic link to the test's Drive folder."""

from __future__ import annotations

import json
import os

from google.colab._standin import record, setting

__all__ = ["flush_and_unmount", "mount"]


def _inside(path: str, root: str) -> bool:
    path, root = os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.realpath(root)
    return path == root or path.startswith(root + os.sep)


def mount(mountpoint: str, force_remount: bool = False, timeout_ms: int = 120000, readonly: bool = False) -> None:
    """Make ``{mountpoint}/MyDrive`` the test's Drive (COLAB_STANDIN_DRIVE/MyDrive)."""
    drive, root = setting("COLAB_STANDIN_DRIVE"), setting("COLAB_STANDIN_ROOT")
    if not _inside(mountpoint, root):
        raise ValueError(f"stand-in drive.mount({mountpoint!r}): outside COLAB_STANDIN_ROOT={root!r}, refused")
    record("drive.mount", mountpoint=mountpoint, force_remount=force_remount, readonly=readonly)
    if os.path.islink(mountpoint):
        if not force_remount:
            print(
                f"Drive already mounted at {mountpoint}; to attempt to forcibly remount, call "
                f'drive.mount("{mountpoint}", force_remount=True).'
            )
            return
        os.unlink(mountpoint)
    if os.path.isdir(mountpoint) and os.listdir(mountpoint):
        raise ValueError("Mountpoint must not already contain files")
    if os.path.isdir(mountpoint):
        os.rmdir(mountpoint)
    os.makedirs(os.path.dirname(os.path.abspath(mountpoint)), exist_ok=True)
    os.makedirs(os.path.join(drive, "MyDrive"), exist_ok=True)
    os.symlink(drive, mountpoint)
    _save_mounts(sorted({*_mounts(), mountpoint}))
    print(f"Mounted at {mountpoint}")


def flush_and_unmount(timeout_ms: int = 24 * 60 * 60 * 1000) -> None:
    """Record the call and remove the mount (the link)."""
    mounted = [m for m in _mounts() if os.path.islink(m)]
    record("drive.flush_and_unmount", mounted=mounted)
    if not mounted:
        print("Drive not mounted, so nothing to flush and unmount.")
    for link in mounted:
        os.unlink(link)
    _save_mounts([])


def _state() -> str:
    return os.path.join(setting("COLAB_STANDIN_ROOT"), ".colab-standin-mounts.json")


def _mounts() -> list[str]:
    """The mountpoints of this "runtime" (the test's root): a mount outlives the kernel, as in Colab."""
    if not os.path.exists(_state()):
        return []
    with open(_state(), encoding="utf-8") as fh:
        return json.load(fh)


def _save_mounts(mounts: list[str]) -> None:
    with open(_state(), "w", encoding="utf-8") as fh:
        json.dump(mounts, fh)
