"""A node's identity, kept on the node's own disk so that a restart without NODE_ID keeps it.

Each identity is a file ``{SWARM_LOCAL_DIR}/{experiment}/identities/{node_id}.id``. A running process holds
an exclusive, non-blocking lock on ``{node_id}.lock`` beside it for as long as it runs (``filelock``: ``flock``
on POSIX, ``LockFileEx`` on Windows, both dropped by the system when the process dies; a PID marker, reclaimed
once its process is gone, where neither exists). A process started without NODE_ID reuses the first identity
of its role that no running process holds, so several workers on one machine get distinct identities and
each restarted one gets its own back.

The node-local record (role, run, last completed round) is ``{node_id}.json`` beside it, replaced
whole (a temporary, ``fsync``, rename), so a process killed while writing it leaves the previous
record, never an empty one. Older versions kept the record inside the ``.id`` file: it is read from there
until the first write, which empties it. The lock is a file of its own because a lock library may truncate,
write into or delete the file it locks; those versions locked the ``.id`` file itself, so a process of
theirs still running is not seen by this one.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path

from filelock import BaseFileLock, FileLock, Timeout

from swarm_gdrive.names import validate_name

logger = logging.getLogger(__name__)


class IdentityError(RuntimeError):
    """The requested NODE_ID is held by another running process on this machine."""


@dataclass
class Identity:
    """A claimed node identity; keep the object alive for as long as the node runs."""

    node_id: str
    generated: bool
    path: Path
    _lock: BaseFileLock

    @property
    def record(self) -> Path:
        """The node-local record's file, beside the identity file."""
        return self.path.with_suffix(".json")

    def read_local(self) -> dict:
        """The node-local record (role, last completed round); {} when the file holds no JSON object."""
        try:
            try:
                text = self.record.read_text(encoding="utf-8")
            except FileNotFoundError:
                text = self.path.read_text(encoding="utf-8")  # an older version's record, inside the .id file
        except FileNotFoundError:
            text = ""
        except (OSError, ValueError):  # a folder or FIFO by that name, not UTF-8
            return {}
        try:
            data = json.loads(text or "{}")
        except (ValueError, RecursionError):  # not JSON, an integer past the conversion limit, nesting
            return {}
        return data if isinstance(data, dict) else {}

    def write_local(self, **values: object) -> None:
        """Update the node-local record (we hold its lock): written whole beside it, then renamed onto it."""
        data = self.read_local() | values
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.record.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(json.dumps(data))
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.record)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        if not _is_empty(self.path):  # an older version's record: the new file holds it now
            self.path.write_bytes(b"")

    def release(self) -> None:
        """Let another process claim this identity; a second call does nothing."""
        self._lock.release(force=True)


def _is_empty(path: Path) -> bool:
    """Whether ``path`` holds nothing; a file another process removed meanwhile holds nothing."""
    try:
        return path.stat().st_size == 0
    except FileNotFoundError:
        return True


def _try_lock(identity_file: Path) -> BaseFileLock | None:
    """Hold ``{node_id}.lock`` beside ``identity_file``; None while another process, or claim, holds it."""
    # thread_local=False: the thread that releases may not be the one that claimed; timeout=0: one attempt
    lock = FileLock(identity_file.with_suffix(".lock"), thread_local=False)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return None
    return lock


def claim_identity(local_dir: str, experiment: str, role: str, node_id: str | None) -> Identity:
    """Claim ``node_id``, or reuse/generate one for ``role``; see the module docstring."""
    folder = Path(local_dir) / validate_name(experiment, "EXPERIMENT_NAME") / "identities"
    folder.mkdir(parents=True, exist_ok=True)
    if node_id is not None:
        path = folder / f"{validate_name(node_id, 'NODE_ID')}.id"
        lock = _try_lock(path)
        if lock is None:
            raise IdentityError(
                f"NODE_ID={node_id!r}: another running process on this machine already is this node; "
                "stop it first or choose another NODE_ID"
            )
        path.touch()
        identity = Identity(node_id, False, path, lock)
        identity.write_local(role=role)
        return identity
    for path in sorted(folder.glob("*.id")):
        lock = _try_lock(path)
        if lock is None:
            continue
        identity = Identity(path.stem, True, path, lock)
        recorded = identity.read_local().get("role")
        if recorded == role:
            logger.info("reusing node identity %s from %s", identity.node_id, path)
            return identity
        if _is_empty(path) and not identity.record.exists():  # died before its first record: nobody owns it
            path.unlink(missing_ok=True)
        identity.release()
    while True:
        candidate = f"{role}-{secrets.token_hex(3)}"
        path = folder / f"{candidate}.id"
        if path.exists():
            continue
        lock = _try_lock(path)
        if lock is not None:
            path.touch()
            identity = Identity(candidate, True, path, lock)
            identity.write_local(role=role)
            logger.info("generated node identity %s (kept in %s)", candidate, path)
            return identity
