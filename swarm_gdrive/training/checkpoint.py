"""Checkpoints in the shared folder: safetensors and JSON only, never a pickle.

``checkpoints/{node_id}/round_{R}/`` holds the model and tokenizer (``save_pretrained``,
safetensors), ``optimizer.safetensors`` (every optimizer tensor and the torch RNG states),
``trainer_state.json`` (round, param groups, scalar optimizer state, Python RNG state) and
``checkpoint.json``: the manifest, naming the node, the run and the round, with every file's
size and sha256. The manifest is written twice: first with ``complete: false`` (before any
other file), last with ``complete: true``. A checkpoint without a valid complete manifest,
with a file that does not match it, or with a file name outside the allowed set is ignored,
so a half-written or planted checkpoint is never loaded; a malformed manifest (not JSON,
too deep, a huge integer, wrong types, a folder or FIFO in its place) is a skipped
checkpoint, never a crash. Pruning removes only what a manifest of this node and run lists.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file

from swarm_gdrive import progress
from swarm_gdrive.protocol.layout import Layout, parse_round_dir
from swarm_gdrive.protocol.records import ExperimentRecord, decode
from swarm_gdrive.protocol.worker import GiveUpError
from swarm_gdrive.storage import Storage
from swarm_gdrive.storage.base import (
    Space,
    free_space,
    human_bytes,
    is_temp_of,
    put_file,
    read_chunks,
    temp_name_for,
)
from swarm_gdrive.training import adapters

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

MANIFEST = "checkpoint.json"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"
#: The only names a checkpoint may contain (no .bin, .pt or .pkl: nothing that unpickles). With LoRA (LORA_R > 0)
#: the model is the adapters alone (adapter_model.safetensors and adapter_config.json); the base is MODEL_NAME.
ALLOWED_FILES = re.compile(
    r"(config\.json|generation_config\.json|model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors\.index\.json"
    r"|tokenizer\.json|tokenizer_config\.json|special_tokens_map\.json|chat_template\.jinja|vocab\.json|merges\.txt"
    r"|added_tokens\.json|optimizer\.safetensors|trainer_state\.json|adapter_model\.safetensors|adapter_config\.json)"
)
#: A checkpoint's JSON and text files (config, tokenizer, trainer state): the most one may take.
MAX_JSON_BYTES = 64 * 1024 * 1024
#: The most any file a manifest lists may claim (its ``size``), whatever the model; a restart bounds each file far
#: tighter by the model it trains (:class:`SizeLimits`).
MAX_FILE_BYTES = 64 * 1024**3
#: A weights or optimizer file may exceed what the model's tensors take by this factor and these bytes (safetensors'
#: JSON header of every tensor, the RNG states, the step counts) before a restart refuses it unread.
SIZE_SLACK_FACTOR, SIZE_SLACK_BYTES = 1.1, 16 * 1024**2
#: Bytes a download of a checkpoint file is streamed in: it is hashed and written out chunk by chunk, never held whole.
DOWNLOAD_CHUNK_BYTES = 4 * 1024**2
#: A manifest lists a few dozen files in a few KB; more is not a manifest this package wrote.
MAX_MANIFEST_BYTES, MAX_MANIFEST_FILES = 1024 * 1024, 1024
#: CHECKPOINT_OPTIMIZER: how AdamW's per-parameter state is stored (:func:`optimizer_to_files`).
OPTIMIZER_STATES = ("bf16", "fp32", "none")
#: CHECKPOINT_OPTIMIZER's ``auto`` keeps a full fine-tune's moments (in bf16) while they add at most this much to a
#: checkpoint: SmolLM2-135M's 0.54 GB and -360M's 1.45 GB do; Qwen2.5-0.5B's would add 1.98 GB to 1.98 GB of
#: weights, so its checkpoints hold the weights alone (a free Drive's 15 GB holds a few of 2 GB, not of 4 GB).
AUTO_MOMENTS_LIMIT_BYTES = 1.5e9
#: 2 names the run and says whether the save completed; 1 (neither) is still read: written by earlier versions.
SCHEMA_VERSION = 2
_SHA256 = re.compile(r"[0-9a-f]{64}")
_RUN_ID = re.compile(r"[0-9a-f]{8,64}")


#: Room for fewer checkpoints than this (the one about to be written included) is warned about.
SPACE_WARN_CHECKPOINTS = 4
#: Room kept beyond a checkpoint for what the node writes between checkpoints (rollouts, logs, heartbeats).
SPACE_RESERVE_BYTES = 64 * 1024**2


class CheckpointError(ValueError):
    """A checkpoint that must not be loaded; the message says why."""


class StorageFullError(GiveUpError):
    """The shared folder has no room for the checkpoint about to be written; nothing of it was written."""


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint as its manifest lists it."""

    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """``checkpoint.json``, parsed and type-checked (:func:`parse_manifest`)."""

    node_id: str
    run_id: str | None  # None: a schema 1 manifest, written before manifests named their run
    round: int
    complete: bool
    files: dict[str, FileEntry]

    def to_json(self) -> bytes:
        files = {name: {"size": e.size, "sha256": e.sha256} for name, e in self.files.items()}
        body = {"kind": "checkpoint", "schema_version": SCHEMA_VERSION, "node_id": self.node_id}
        body.update(run_id=self.run_id, round=self.round, complete=self.complete, files=files)
        return json.dumps(body, sort_keys=True).encode()


@dataclass(frozen=True)
class Restored:
    """What :func:`load_latest` found: the round and a local folder with the model files."""

    round: int
    folder: Path


_WEIGHTS = re.compile(r"model(-\d{5}-of-\d{5})?\.safetensors|adapter_model\.safetensors")


@dataclass(frozen=True)
class SizeLimits:
    """The most bytes the files of a checkpoint of the model being trained can take, so that a restart refuses a
    manifest that claims more before a byte of it is downloaded (:func:`size_limits`).

    ``weights`` bounds the model's safetensors (all shards together) and the adapters; ``optimizer`` bounds
    ``optimizer.safetensors``; every other file (JSON, tokenizer) is bounded by :data:`MAX_JSON_BYTES`.
    """

    weights: int
    optimizer: int

    def check(self, manifest: Manifest) -> None:
        """CheckpointError naming the first file whose claimed size is over its bound, or the shards' total."""
        for name, entry in manifest.files.items():
            if entry.size > (bound := self.bound(name)):
                raise CheckpointError(
                    f"{name} claims {entry.size} bytes ({human_bytes(entry.size)}), over the {bound} bytes "
                    f"({human_bytes(bound)}) a checkpoint of this model can take; not downloaded"
                )
        shards = sum(
            e.size for n, e in manifest.files.items() if _WEIGHTS.fullmatch(n) and n != adapters.ADAPTER_WEIGHTS
        )
        if shards > self.weights:
            raise CheckpointError(
                f"the model's safetensors claim {shards} bytes together ({human_bytes(shards)}), over "
                f"the {self.weights} bytes ({human_bytes(self.weights)}) a checkpoint of this model can take; "
                "not downloaded"
            )

    def bound(self, name: str) -> int:
        if name == OPTIMIZER_FILE:
            return self.optimizer
        return self.weights if _WEIGHTS.fullmatch(name) else MAX_JSON_BYTES


def size_limits(model: torch.nn.Module) -> SizeLimits:
    """What a checkpoint of ``model`` can take, from its parameter count and dtypes, with slack.

    Weights: every tensor of its ``state_dict`` (with LoRA, the base and the adapters). Optimizer: AdamW's two
    moments of every parameter (trained or not, with LoRA) and a step count each. Every tensor counts at least
    4 bytes an element (float32), so a checkpoint written before a change of WEIGHT_DTYPE, LORA_R or
    CHECKPOINT_OPTIMIZER is still downloaded and meets the check that names the setting, not a size refusal.
    Each bound is widened by :data:`SIZE_SLACK_FACTOR` and :data:`SIZE_SLACK_BYTES`.
    """

    def nbytes(tensor: torch.Tensor) -> int:
        return tensor.numel() * max(tensor.element_size(), 4)

    weights = sum(nbytes(t) for t in model.state_dict().values())
    optimizer = sum(2 * nbytes(p) + 4 for p in model.parameters())
    return SizeLimits(*(int(n * SIZE_SLACK_FACTOR) + SIZE_SLACK_BYTES for n in (weights, optimizer)))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def optimizer_to_files(
    optimizer: torch.optim.Optimizer, moments: str = "fp32"
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split ``optimizer.state_dict()`` into tensors (for safetensors) and JSON-able scalars.

    ``moments`` (CHECKPOINT_OPTIMIZER): ``fp32`` keeps every tensor as it is; ``bf16`` stores AdamW's float32
    moments (``exp_avg``, ``exp_avg_sq``) in bfloat16, half the bytes (float32's exponent range, so no moment
    underflows; 8 bits of mantissa, a relative error below 0.4 %), and ``step`` exactly; ``none`` stores no
    per-parameter state at all (a resume starts AdamW afresh). Loading casts the moments back to the parameters'
    dtype (``Optimizer.load_state_dict``). The choice is recorded as ``optimizer_state`` in the metadata.
    """
    if moments not in OPTIMIZER_STATES:
        raise ValueError(f"moments={moments!r}: use one of {', '.join(OPTIMIZER_STATES)} (CHECKPOINT_OPTIMIZER)")
    state = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, values in state["state"].items() if moments != "none" else ():
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                value = value.detach().cpu()
                if moments == "bf16" and name != "step" and value.dtype == torch.float32 and value.dim() > 0:
                    value = value.to(torch.bfloat16)
                tensors[f"optim.{index}.{name}"] = value.contiguous()
            else:
                scalars.setdefault(str(index), {})[name] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars, "optimizer_state": moments}


def optimizer_from_files(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    """Rebuild an optimizer ``state_dict`` from :func:`optimizer_to_files`' parts."""
    state: dict[int, dict[str, Any]] = {}
    for key, tensor in tensors.items():
        if not key.startswith("optim."):
            continue
        _, index, name = key.split(".", 2)
        state.setdefault(int(index), {})[name] = tensor
    for index, values in meta.get("scalars", {}).items():
        state.setdefault(int(index), {}).update(values)
    return {"state": state, "param_groups": meta["param_groups"]}


def param_digest(model: PreTrainedModel) -> str:
    """sha256 over every parameter's name and bytes, in name order: equal digests, equal weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().float().numpy().tobytes())
    return digest.hexdigest()[:16]


def rng_tensors() -> dict[str, torch.Tensor]:
    out = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            out[f"rng.cuda.{i}"] = s
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        out["rng.mps"] = torch.mps.get_rng_state()
    return out


def save(
    storage: Storage,
    layout: Layout,
    node_id: str,
    round_: int,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    optimizer: torch.optim.Optimizer,
    keep_last: int = 2,
    extra: dict[str, Any] | None = None,
    optimizer_state: str = "bf16",
) -> str:
    """Write a checkpoint of ``round_`` and remove this node's older ones beyond ``keep_last``.

    ``optimizer_state`` (CHECKPOINT_OPTIMIZER, resolved): how AdamW's moments are stored (:func:`optimizer_to_files`).
    Before anything is written the storage's free space is checked (:func:`check_space`): StorageFullError when
    the checkpoint would not fit. The manifest goes first with ``complete: false`` (so an interrupted save is
    provably this node's and its pruning can remove it), then every file, then the manifest again with
    ``complete: true``.
    """
    started = time.monotonic()
    folder = layout.checkpoint_dir(node_id, round_)
    run_id = current_run(storage, layout)
    with tempfile.TemporaryDirectory(prefix="swarm-ckpt-") as tmp:
        local = Path(tmp)
        model.save_pretrained(local, safe_serialization=True)
        tokenizer.save_pretrained(local)
        tensors, meta = optimizer_to_files(optimizer, optimizer_state)
        save_file({**tensors, **rng_tensors()}, str(local / OPTIMIZER_FILE))
        py_version, py_state, py_gauss = random.getstate()
        meta.update({"round": round_, "python_rng": [py_version, list(py_state), py_gauss], "extra": extra or {}})
        (local / STATE_FILE).write_text(json.dumps(meta))
        paths = [p for p in sorted(local.iterdir()) if p.is_file() and ALLOWED_FILES.fullmatch(p.name)]
        files = {p.name: FileEntry(p.stat().st_size, _sha256_file(p)) for p in paths}
        total = sum(f.size for f in files.values())
        check_space(storage, round_, total)
        manifest = Manifest(node_id, run_id, round_, False, files)
        storage.write_bytes(f"{folder}/{MANIFEST}", manifest.to_json())
        with progress.task(f"checkpoint upload (round {round_})", total, "B") as work:
            for path in paths:
                put_file(storage, f"{folder}/{path.name}", path)
                work.advance(files[path.name].size)
    storage.write_bytes(f"{folder}/{MANIFEST}", replace(manifest, complete=True).to_json())
    logger.info(
        "checkpoint of round %d: %s in %d files in %.1f s",
        round_,
        human_bytes(total),
        len(files),
        time.monotonic() - started,
    )
    _prune(storage, layout, node_id, keep_last, keep=round_, run_id=run_id)
    return folder


def resolve_optimizer_state(setting: str, lora: bool, trained_parameters: int = 0) -> str:
    """CHECKPOINT_OPTIMIZER's ``auto``: fp32 with LoRA (the adapters' state is a few MB, so exactness costs
    nothing); for a full fine-tune of ``trained_parameters`` weights, bf16 moments (a third of its checkpoint)
    while their 4 bytes a weight stay within :data:`AUTO_MOMENTS_LIMIT_BYTES`, else none (the weights alone:
    a resume starts AdamW afresh). Any other value as it is."""
    if setting != "auto":
        return setting
    if lora:
        return "fp32"
    return "bf16" if 4 * trained_parameters <= AUTO_MOMENTS_LIMIT_BYTES else "none"


def check_space(storage: Storage, round_: int, needed: int) -> Space | None:
    """Refuse (StorageFullError) a checkpoint of ``needed`` bytes that the storage has no room for, and WARN
    while the room left is under :data:`SPACE_WARN_CHECKPOINTS` of them; the room where the backend can tell
    (:func:`~swarm_gdrive.storage.base.free_space`), else nothing is checked. Returns what it read."""
    try:
        space = free_space(storage)
    except OSError as exc:  # a quota that cannot be read is not a reason to stop training
        logger.warning("checkpoints: the free space of %s is unknown (%s); not checked", storage.describe(), exc)
        return None
    if space is None or space.free is None:
        return space
    trash = f", {human_bytes(space.trash)} of it in Drive's trash" if space.trash else ""
    fixes = (
        "empty Drive's trash (drive.google.com/drive/trash, Empty trash)" + (" and " if space.trash else ", or ")
        if space.trash or space.deletes_to_trash
        else ""
    )
    fixes += (
        "delete old experiments, or make checkpoints smaller or rarer: CHECKPOINT_OPTIMIZER=none (the weights "
        "alone), LORA_R=16 (adapters alone), KEEP_CHECKPOINTS=1 if it is higher, a larger CHECKPOINT_MINUTES "
        "(docs/storage.md)"
    )
    used = (
        f"{human_bytes(space.total - space.free)} of {human_bytes(space.total)} used{trash}"
        if space.total
        else "no limit"
    )
    room = (space.free - SPACE_RESERVE_BYTES) // max(needed, 1)  # checkpoints that fit, this one included
    if room < 1:
        raise StorageFullError(
            f"checkpoint of round {round_} not written: it takes {human_bytes(needed)} and {space.where} has "
            f"{human_bytes(space.free)} free ({used}); this node stops here, before a write fails half-way: {fixes}; "
            "then start it again (it resumes from its latest checkpoint)"
        )
    if room < SPACE_WARN_CHECKPOINTS:
        logger.warning(
            "storage nearly full: %s has %s free (%s), room for %d checkpoint(s) of %s, this one included; the node "
            "stops before a checkpoint that does not fit. To make room: %s",
            space.where,
            human_bytes(space.free),
            used,
            room,
            human_bytes(needed),
            fixes,
        )
    return space


def current_run(storage: Storage, layout: Layout) -> str | None:
    """The run id of ``experiment.json``; None (with a WARNING) if it cannot be read or is not valid."""
    try:
        return decode(storage.read_bytes(layout.experiment_file, 64 * 1024), ExperimentRecord).run_id
    except (OSError, ValueError, RecursionError) as exc:
        logger.warning("checkpoints: the run of %s is unknown (%s)", layout.experiment_file, exc)
        return None


def _rounds(storage: Storage, layout: Layout, node_id: str) -> list[int]:
    base = layout.checkpoint_dir(node_id, 0).rsplit("/", 1)[0]
    return sorted(r for info in storage.list(base) if info.is_dir and (r := parse_round_dir(info.name)) is not None)


def _prune(
    storage: Storage, layout: Layout, node_id: str, keep_last: int, keep: int, run_id: str | None = None
) -> None:
    """Keep the checkpoint just written (``keep``) and the newest ``keep_last - 1`` whole ones before it.

    Only folders older than ``keep`` are looked at, and only those whose manifest names this node, this run
    (or none: schema 1) and the folder's round are removed, and of them only the files the manifest lists:
    a folder someone else planted, another node's checkpoints (a name that collided by case), a folder
    without a manifest are left, with a WARNING. Only whole checkpoints count towards ``keep_last``, so an
    interrupted save never takes the place of a good checkpoint that a later restart needs.
    """
    older = [r for r in _rounds(storage, layout, node_id) if r < keep]
    whole = 0
    for round_ in reversed(older):  # newest first
        folder = layout.checkpoint_dir(node_id, round_)
        try:
            manifest = _read_manifest(storage, folder, node_id, round_)
            if manifest.run_id is not None and manifest.run_id != run_id:
                raise CheckpointError(f"manifest is of run {manifest.run_id}, not {run_id}")
        except (CheckpointError, OSError) as exc:
            logger.warning("pruning: left %s alone: %s", folder, exc)
            continue
        if whole < keep_last - 1 and _is_loadable(manifest):
            whole += 1
            continue
        try:
            _remove(storage, folder, manifest)
        except OSError as exc:
            logger.warning("pruning: could not remove all of %s: %s", folder, exc)


def _remove(storage: Storage, folder: str, manifest: Manifest) -> None:
    """Delete what ``manifest`` lists (and temporaries of those names), the manifest last, then the folder.

    The manifest is first made incomplete, so a checkpoint half removed is never loaded and is still
    provably this node's when pruning meets it again.
    """
    if manifest.complete:
        storage.write_bytes(f"{folder}/{MANIFEST}", replace(manifest, complete=False).to_json())
    names = set(manifest.files) | {MANIFEST}
    for info in storage.list(folder, include_hidden=True):
        if info.name != MANIFEST and (info.name in names or any(is_temp_of(info.name, n) for n in names)):
            storage.delete(f"{folder}/{info.name}")
    storage.delete(f"{folder}/{MANIFEST}")
    if not storage.remove_empty_dir(folder):
        logger.warning("pruning: left %s: it holds files its manifest does not list", folder)
    if getattr(storage, "on_google_drive", False):  # a mounted Drive: a deleted file goes to Drive's trash
        _say_trashed(folder, sum(e.size for e in manifest.files.values()))


_trash_explained: list[bool] = []


def _say_trashed(folder: str, size: int) -> None:
    """Say (a WARNING the first time, INFO after) that a pruned checkpoint on a mounted Drive still takes room."""
    first = not _trash_explained
    _trash_explained.append(True)
    logger.log(
        logging.WARNING if first else logging.INFO,
        "pruned checkpoint %s (%s): on a mounted Google Drive it went to Drive's trash, where it still counts against "
        "the account's storage for 30 days%s",
        folder,
        human_bytes(size),
        ": empty the trash (drive.google.com/drive/trash, Empty trash) to get the space back, or use the Drive API "
        "(STORAGE='api' in the notebooks, GDRIVE_PATH=gdrive://...), whose deletes are permanent (docs/storage.md)"
        if first
        else "",
    )


def _read_manifest(storage: Storage, folder: str, node_id: str, round_: int) -> Manifest:
    """This node's manifest of this round; CheckpointError says why not (the caller checks the run)."""
    try:
        data = storage.read_bytes(f"{folder}/{MANIFEST}", MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise CheckpointError("no manifest (incomplete checkpoint)") from None
    except OSError as exc:  # over the cap, a folder, a FIFO, a link
        raise CheckpointError(f"manifest not read: {exc}") from None
    manifest = parse_manifest(data)
    if manifest.node_id != node_id or manifest.round != round_:
        raise CheckpointError(
            f"manifest does not describe this node's checkpoint of this round (it names node "
            f"{manifest.node_id!r}, round {manifest.round})"
        )
    return manifest


def parse_manifest(data: bytes) -> Manifest:
    """``checkpoint.json`` parsed and checked; CheckpointError for anything else, whatever the bytes."""
    try:
        raw = json.loads(data)
    except RecursionError:
        raise CheckpointError("manifest is not JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer past Python's digit limit
        raise CheckpointError(f"manifest is not JSON: {str(exc)[:200]}") from None
    if not isinstance(raw, dict) or raw.get("kind") != "checkpoint":
        raise CheckpointError("manifest is not an object of kind 'checkpoint'")
    version = raw.get("schema_version")
    if type(version) is not int or version not in (1, SCHEMA_VERSION):
        raise CheckpointError(f"manifest schema_version {str(version)[:20]} is not supported (1 or 2)")
    node_id, round_, files = raw.get("node_id"), raw.get("round"), raw.get("files")
    run_id, complete = (raw.get("run_id"), raw.get("complete")) if version == SCHEMA_VERSION else (None, True)
    if not isinstance(node_id, str) or type(round_) is not int or round_ < 0 or type(complete) is not bool:
        raise CheckpointError("manifest has no valid node_id, round or complete")
    if run_id is not None and not (isinstance(run_id, str) and _RUN_ID.fullmatch(run_id)):
        raise CheckpointError("manifest has no valid run_id")
    if not isinstance(files, dict) or len(files) > MAX_MANIFEST_FILES:
        raise CheckpointError(f"manifest's files is not an object of at most {MAX_MANIFEST_FILES} entries")
    return Manifest(node_id, run_id, round_, complete, {name: _entry(name, e) for name, e in files.items()})


def _entry(name: str, entry: object) -> FileEntry:
    if not ALLOWED_FILES.fullmatch(name):
        raise CheckpointError(f"file {name[:100]!r} is not an allowed checkpoint file (safetensors and JSON only)")
    size = entry.get("size") if isinstance(entry, dict) else None
    sha = entry.get("sha256") if isinstance(entry, dict) else None
    if type(size) is not int or not 0 <= size <= MAX_FILE_BYTES:
        raise CheckpointError(f"file {name!r} has no valid size")
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise CheckpointError(f"file {name!r} has no valid sha256")
    return FileEntry(size, sha)


def _is_loadable(manifest: Manifest) -> bool:
    try:
        _check_loadable(manifest)
    except CheckpointError:
        return False
    return True


def _check_loadable(manifest: Manifest, run_id: str | None = None) -> None:
    """A whole checkpoint of ``run_id`` (any run if None): complete, with a model and a training state."""
    if run_id is not None and manifest.run_id is not None and manifest.run_id != run_id:
        raise CheckpointError(f"manifest is of run {manifest.run_id}, not this experiment's ({run_id})")
    if not manifest.complete:
        raise CheckpointError("an interrupted save (manifest complete: false)")
    names = set(manifest.files)
    if OPTIMIZER_FILE not in names or STATE_FILE not in names:
        raise CheckpointError("manifest lacks the optimizer or trainer state")
    has_adapters = {adapters.ADAPTER_WEIGHTS, adapters.ADAPTER_CONFIG} <= names
    if not has_adapters and (
        "config.json" not in names or not ({"model.safetensors", "model.safetensors.index.json"} & names)
    ):
        raise CheckpointError("manifest lacks the model (config.json and model safetensors, or LoRA adapters)")


def load_latest(
    storage: Storage,
    layout: Layout,
    node_id: str,
    into: Path,
    before: int | None = None,
    limits: SizeLimits | None = None,
) -> Restored | None:
    """Download this node's newest valid checkpoint into ``into``; None if there is none.

    A checkpoint that fails any check is skipped with a logged reason and the next older one is tried. Before a
    byte of a file is read, the size its manifest claims is checked against ``limits`` (the model being trained:
    :func:`size_limits`; :data:`MAX_FILE_BYTES` without) and against the real file's size in the folder's listing;
    each file is then streamed to a temporary file beside its final name, hashed as it streams, never more than
    its claimed size read, and renamed into place only when its sha256 matches. Nothing is loaded here.
    """
    run_id = current_run(storage, layout)
    for round_ in reversed(_rounds(storage, layout, node_id)):
        if before is not None and round_ >= before:
            continue
        folder = layout.checkpoint_dir(node_id, round_)
        target = into / f"round_{round_}"
        try:
            manifest = _read_manifest(storage, folder, node_id, round_)
            _check_loadable(manifest, run_id)
            if limits is not None:
                limits.check(manifest)
            _check_real_sizes(storage, folder, manifest)
            target.mkdir(parents=True, exist_ok=True)
            total = sum(e.size for e in manifest.files.values())
            with progress.task(f"checkpoint download (round {round_})", total, "B") as work:
                for name, entry in manifest.files.items():
                    _download(storage, f"{folder}/{name}", entry, target / name)
                    work.advance(entry.size)
        except (CheckpointError, OSError) as exc:
            logger.warning("skipping checkpoint %s: %s", folder, exc)
            continue
        return Restored(round_, target)
    return None


def _check_real_sizes(storage: Storage, folder: str, manifest: Manifest) -> None:
    """CheckpointError unless every file the manifest lists is in the folder with the size it claims (one
    listing: a local or mounted folder's stat, Drive's and an object store's metadata); nothing is read."""
    listed = {info.name: info for info in storage.list(folder)}
    for name, entry in manifest.files.items():
        info = listed.get(name)
        if info is None or info.is_dir:
            raise CheckpointError(
                f"No such file: {name}, which the manifest lists" if info is None else f"{name} is a folder"
            )
        if info.size != entry.size:
            how = "exceeds" if info.size > entry.size else "falls short of"
            raise CheckpointError(
                f"{name} is {info.size} bytes, which {how} the {entry.size} bytes its manifest claims; not downloaded"
            )


def _download(storage: Storage, path: str, entry: FileEntry, dest: Path) -> None:
    """``path`` into ``dest`` if its bytes are ``entry``'s: streamed to a temporary beside ``dest`` and hashed
    chunk by chunk (memory stays at one chunk whatever the size), at most ``entry.size`` bytes read (the backend
    stops past it: FileTooLargeError), renamed to ``dest`` only when the size and sha256 match."""
    digest, count = hashlib.sha256(), 0
    temp = dest.with_name(temp_name_for(dest.name))
    try:
        with temp.open("wb") as out:
            for chunk in read_chunks(storage, path, entry.size, DOWNLOAD_CHUNK_BYTES):
                count += len(chunk)
                if count > entry.size:  # a backend without its own cap in the loop
                    raise CheckpointError(f"{dest.name} exceeds the {entry.size} bytes its manifest claims")
                digest.update(chunk)
                out.write(chunk)
        if count != entry.size or digest.hexdigest() != entry.sha256:
            raise CheckpointError(f"{dest.name} does not match the manifest (size or sha256)")
        temp.replace(dest)
    finally:
        temp.unlink(missing_ok=True)


def read_extra(folder: Path) -> dict[str, Any]:
    """The workload's own JSON state saved with a checkpoint (e.g. curriculum levels)."""
    extra = json.loads((folder / STATE_FILE).read_text()).get("extra", {})
    return extra if isinstance(extra, dict) else {}


def restore_training_state(folder: Path, optimizer: torch.optim.Optimizer) -> int:
    """Load optimizer and RNG states from a restored folder; returns the checkpoint's round."""
    meta = json.loads((folder / STATE_FILE).read_text())
    tensors = load_file(str(folder / OPTIMIZER_FILE))
    optimizer.load_state_dict(optimizer_from_files(tensors, meta))  # bf16 moments come back in the params' dtype
    if meta.get("optimizer_state") == "none":
        logger.info("the checkpoint holds no AdamW state (CHECKPOINT_OPTIMIZER=none): its moments and warmup restart")
    if "rng.torch" in tensors:
        torch.set_rng_state(tensors["rng.torch"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("rng.cuda."))]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    if "rng.mps" in tensors and getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        torch.mps.set_rng_state(tensors["rng.mps"])
    version, state, gauss = meta["python_rng"]
    random.setstate((version, tuple(state), gauss))
    return int(meta["round"])
