"""Who may change the run's lifecycle: the coordinator's Ed25519 key, its signatures, and a worker's pin of it.

The coordinator holds a key pair; the private key stays on its own machine (:func:`key_path`: COORDINATOR_KEY_FILE,
else ``{SWARM_LOCAL_DIR}/{experiment}/coordinator_key.pem``, never inside GDRIVE_PATH), and its public key is in
experiment.json. It signs experiment.json and every state it writes: ``signature`` is Ed25519 over
:func:`canonical`, the record's other fields as JSON with sorted keys and no spaces (GDRIVE_IMPLEMENTATION.md §5.5).

A worker pins the key on first contact (trust on first use) in its node-local record, with the run and its
``created_at``; :func:`pin_verdict` then accepts only an experiment.json that key signed, of the pinned run or of
a newer one (a reset by the same coordinator). An archived run replayed into place is older, so it is refused.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import TypeVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from swarm_gdrive.protocol.records import ExperimentRecord, StateRecord

logger = logging.getLogger(__name__)

#: The key file's name under ``{SWARM_LOCAL_DIR}/{experiment}/`` when COORDINATOR_KEY_FILE is unset.
KEY_FILE_NAME = "coordinator_key.pem"

Signed = TypeVar("Signed", ExperimentRecord, StateRecord)


class KeyFileError(RuntimeError):
    """The coordinator key file cannot be read or written; the message names the file and the fix."""


def key_path(local_dir: str, experiment: str, key_file: str | None) -> Path:
    """Where the coordinator's private key is: COORDINATOR_KEY_FILE (``key_file``), else
    ``{SWARM_LOCAL_DIR}/{experiment}/coordinator_key.pem``."""
    if key_file:
        return Path(key_file).expanduser()
    return Path(local_dir).expanduser() / experiment / KEY_FILE_NAME


def canonical(record: ExperimentRecord | StateRecord) -> bytes:
    """The bytes a signature covers: every field but ``signature`` (as the file's JSON has them), sorted keys, no
    spaces, UTF-8. ``kind`` is among them, so a state's signature is no experiment's."""
    fields = record.model_dump(mode="json", exclude={"signature"})
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def short(public_key: str | None) -> str:
    """A key as log lines show it: its first 16 hex digits."""
    return "none" if public_key is None else public_key[:16]


class CoordinatorKey:
    """The coordinator's Ed25519 private key, loaded from or created at its file."""

    def __init__(self, private: Ed25519PrivateKey, path: Path) -> None:
        self._private = private
        self.path = path
        raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        #: The public key, 64 hex digits: experiment.json's ``public_key``.
        self.public = raw.hex()

    def sign(self, record: Signed) -> Signed:
        """``record`` with its ``signature`` over :func:`canonical` of its other fields."""
        unsigned = record.model_copy(update={"signature": None})
        return record.model_copy(update={"signature": self._private.sign(canonical(unsigned)).hex()})

    @classmethod
    def load(cls, path: Path) -> CoordinatorKey | None:
        """The key in ``path``; None when there is no file. Raises :class:`KeyFileError` for one that holds no
        Ed25519 private key."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise KeyFileError(f"coordinator key file {path}: {exc.strerror or exc}") from None
        try:
            private = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError):
            private = None
        if not isinstance(private, Ed25519PrivateKey):
            raise KeyFileError(
                f"coordinator key file {path} holds no unencrypted Ed25519 private key (PEM, PKCS8): restore the "
                "file this coordinator wrote, or point COORDINATOR_KEY_FILE at it"
            )
        return cls(private, path)

    @classmethod
    def load_or_create(cls, path: Path) -> CoordinatorKey:
        """The key in ``path``, created there when absent: written whole to a temporary (mode 0600), then linked to
        ``path``, which fails if it exists, so two coordinators started together end with the one key."""
        key = cls.load(path)
        if key is not None:
            return key
        private = Ed25519PrivateKey.generate()
        pem = private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # mode 0600
        except OSError as exc:
            raise KeyFileError(f"cannot create coordinator key file {path}: {exc.strerror or exc}") from None
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(pem)
                out.flush()
                os.fsync(out.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:  # another coordinator created it meanwhile: that key is the one
                return cls.load(path) or cls(private, path)
            except OSError:  # a file system without hard links (some FUSE mounts): replace, as every writer does
                os.replace(tmp, path)
        except OSError as exc:
            raise KeyFileError(f"cannot write coordinator key file {path}: {exc.strerror or exc}") from None
        finally:
            Path(tmp).unlink(missing_ok=True)
        key = cls(private, path)
        logger.info("created the coordinator key %s in %s", short(key.public), path)
        return key


def signed_by(record: ExperimentRecord | StateRecord, public_key: str) -> bool:
    """Whether ``record``'s signature is ``public_key``'s over :func:`canonical` of its other fields."""
    if record.signature is None:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key)).verify(
            bytes.fromhex(record.signature), canonical(record)
        )
    except (InvalidSignature, ValueError):
        return False
    return True


def self_signed(experiment: ExperimentRecord) -> bool:
    """Whether experiment.json names a public key and is signed by it."""
    return experiment.public_key is not None and signed_by(experiment, experiment.public_key)


#: The node-local record's fields that hold a worker's pin (identity.py's ``{node_id}.json``).
PIN_FIELDS = ("coordinator_key", "run_id", "run_created_at")


def pin_verdict(local: dict, experiment: ExperimentRecord, repin: bool = False) -> str | None:
    """Why a worker whose node-local record is ``local`` must not join ``experiment`` (None: it may, and it then
    pins :func:`pin_of` it). Without a pinned key (first contact, or REPIN_COORDINATOR_KEY=true: ``repin``) any
    experiment is joined, one that names a key only if that key signed it. With one, only an experiment.json that
    key signed, of the pinned run or of a run created later (a reset by the same coordinator)."""
    pinned = None if repin else local.get("coordinator_key")
    if experiment.public_key is not None and not self_signed(experiment):
        return f"experiment.json (run {experiment.run_id}) is not signed by the coordinator key it names"
    if not isinstance(pinned, str):
        return None
    fix = (
        "a forgery, or the operator reset the experiment with a new coordinator key: then restart this worker once "
        "with REPIN_COORDINATOR_KEY=true"
    )
    if experiment.public_key != pinned:
        return (
            f"experiment.json (run {experiment.run_id}) names coordinator key {short(experiment.public_key)}, not "
            f"the key this worker pinned ({short(pinned)}): {fix}"
        )
    if experiment.run_id == local.get("run_id"):
        return None
    since = local.get("run_created_at")
    if isinstance(since, (int, float)) and experiment.created_at <= since:
        return (
            f"experiment.json names run {experiment.run_id}, created before the pinned run {local.get('run_id')} "
            "(an older run of this coordinator put back in place): not joined"
        )
    return None


def pin_of(experiment: ExperimentRecord) -> dict[str, object]:
    """The node-local record's pin fields for ``experiment``, which :func:`pin_verdict` accepted."""
    return {
        "coordinator_key": experiment.public_key,
        "run_id": experiment.run_id,
        "run_created_at": experiment.created_at,
    }
