"""What an experiment takes in the shared folder: its size by part, how much of it was written in the last hour, and
the room the storage has left (Drive's quota, a file system's free space).

One walk of the experiment folder's listings (sizes and modification times; nothing is downloaded), at most
:data:`MAX_FOLDERS` folders and :data:`MAX_ENTRIES` entries. "Written in the last hour" counts the files whose
modification time is within the hour before the monitor's clock and that are still there: what the experiment grew
by in that hour, less nothing that was deleted since (a pruned checkpoint is gone from it; on a mounted Drive its
bytes went to Drive's trash, which the storage line shows where the backend reports it). Read only, like every
observer.
"""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass, field

from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.storage import Storage
from swarm_gdrive.storage.base import Space, free_space
from swarm_gdrive.storage.base import human_bytes as human

logger = logging.getLogger(__name__)

#: Folders listed at most for one measure (a listing each; Drive: a request each): beyond, the size is a lower bound.
MAX_FOLDERS = 2000
#: Entries (files and folders) counted at most for one measure: a participant may plant any number of files, and a
#: reader's first answer should not wait for all of them; beyond, the size is a lower bound (``at least``).
MAX_ENTRIES = 20_000
#: The window of "written in the last hour", seconds.
HOUR = 3600.0
#: The room left is warned about below this many of the experiment's largest checkpoints (a worker stops before a
#: checkpoint that does not fit: training.checkpoint.check_space).
LOW_SPACE_CHECKPOINTS = 4
#: A live dashboard reloads every few seconds; the walk lists every folder of the experiment (through the Drive API
#: a request each), so :func:`recent` measures one storage's experiment at most this often and repeats the last
#: figures in between.
REMEASURE_SECONDS = 300.0

_measured: weakref.WeakKeyDictionary[Storage, dict[str, tuple[float, FolderUsage]]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class FolderUsage:
    """An experiment folder's bytes and files, by top-level part (``checkpoints``, ``rollouts``, ``logs`` ...)."""

    bytes: int = 0
    files: int = 0
    by_part: dict[str, int] = field(default_factory=dict)
    #: Bytes of the files modified within :data:`HOUR` before the measure, still there.
    last_hour: int = 0
    #: The largest ``checkpoints/{node}/round_{R}`` folder, bytes (0: none).
    largest_checkpoint: int = 0
    #: False when the walk stopped at :data:`MAX_FOLDERS` or :data:`MAX_ENTRIES` or a listing failed: the figures
    #: are lower bounds.
    complete: bool = True
    #: The storage's room (:func:`~swarm_gdrive.storage.base.free_space`); None where it cannot tell.
    space: Space | None = None


def measure(storage: Storage, experiment: str, now: float) -> FolderUsage:
    """Walk ``experiments/{experiment}/`` and read the storage's free space; never raises for a storage error."""
    root = Layout(experiment).root
    total = files = last_hour = 0
    by_part: dict[str, int] = {}
    checkpoints: dict[str, int] = {}
    complete = True
    todo, listed, seen = [root], 0, 0
    while todo:
        if listed >= MAX_FOLDERS or seen >= MAX_ENTRIES:
            complete = False
            break
        folder = todo.pop()
        listed += 1
        try:
            entries = storage.list(folder)
        except OSError as exc:
            logger.debug("usage: %s not listed: %s", folder, exc)
            complete = False
            continue
        inner = folder[len(root) + 1 :].split("/") if folder != root else []
        seen += len(entries)
        for info in entries:
            if info.is_dir:
                todo.append(f"{folder}/{info.name}")
                continue
            total, files = total + info.size, files + 1
            part = inner[0] if inner else "(top)"
            by_part[part] = by_part.get(part, 0) + info.size
            if now - HOUR <= info.mtime <= now + 60:  # a writer's clock a little ahead still counts
                last_hour += info.size
            if len(inner) == 3 and inner[0] == "checkpoints":
                key = "/".join(inner)
                checkpoints[key] = checkpoints.get(key, 0) + info.size
    try:
        space = free_space(storage)
    except OSError as exc:
        logger.debug("usage: the free space of %s is unknown: %s", storage.describe(), exc)
        space = None
    return FolderUsage(total, files, by_part, last_hour, max(checkpoints.values(), default=0), complete, space)


def recent(storage: Storage, experiment: str, now: float, max_age: float = REMEASURE_SECONDS) -> FolderUsage:
    """:func:`measure`, or this process's measure of the same storage object and experiment if it is younger than
    ``max_age`` seconds (on the monotonic clock)."""
    clock = time.monotonic()
    try:
        seen = _measured.setdefault(storage, {})
    except TypeError:  # a storage that cannot be weakly referenced: measured every time
        return measure(storage, experiment, now)
    cached = seen.get(experiment)
    if cached is not None and clock - cached[0] < max_age:
        return cached[1]
    usage = measure(storage, experiment, now)
    seen[experiment] = (clock, usage)
    return usage


def describe(usage: FolderUsage) -> str:
    """One line: the size by part, the last hour's writes, and the storage's room."""
    at_least = "" if usage.complete else "at least "
    parts = ", ".join(f"{name} {human(n)}" for name, n in sorted(usage.by_part.items(), key=lambda kv: -kv[1]))
    text = (
        f"the experiment takes {at_least}{human(usage.bytes)} in {usage.files} file(s)"
        + (f" ({parts})" if parts else "")
        + f"; {human(usage.last_hour)} written in the last hour (files written then and still there)"
    )
    space = usage.space
    if space is not None and space.free is not None:
        total = f" of {human(space.total)}" if space.total else ""
        trash = f", {human(space.trash)} of it in Drive's trash" if space.trash else ""
        text += f"; {space.where}: {human(space.free)} free{total}{trash}"
        if space.deletes_to_trash:
            text += " (deletes here go to Drive's trash until it is emptied)"
    return text


def low_space(usage: FolderUsage) -> str | None:
    """A warning when the room left is under :data:`LOW_SPACE_CHECKPOINTS` of the largest checkpoint; else None."""
    space = usage.space
    if space is None or space.free is None or not usage.largest_checkpoint:
        return None
    if space.free >= LOW_SPACE_CHECKPOINTS * usage.largest_checkpoint:
        return None
    return (
        f"{space.where} has {human(space.free)} free, room for {space.free // usage.largest_checkpoint} more "
        f"checkpoint(s) of {human(usage.largest_checkpoint)}: a worker stops before one that does not fit. Empty "
        "Drive's trash, delete old experiments, or make checkpoints smaller or rarer (CHECKPOINT_OPTIMIZER=none, "
        "LORA_R, KEEP_CHECKPOINTS=1 if it is higher, a larger CHECKPOINT_MINUTES; docs/storage.md)"
    )
