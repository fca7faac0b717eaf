"""Checkpoints in the shared folder: safetensors and JSON only, never a pickle.

``checkpoints/{node_id}/round_{R}/`` holds the model and tokenizer (``save_pretrained``,
safetensors), ``optimizer.safetensors`` (every optimizer tensor and the torch RNG states),
``trainer_state.json`` (round, param groups, scalar optimizer state, Python RNG state) and,
written last, ``checkpoint.json``: the manifest with every file's size and sha256. A
checkpoint without a valid manifest, with a file that does not match it, or with a file
name outside the allowed set is ignored, so a half-written or planted checkpoint is never
loaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file

from swarm_gdrive.protocol.layout import Layout, parse_round_dir
from swarm_gdrive.storage import Storage

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

MANIFEST = "checkpoint.json"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"
#: The only names a checkpoint may contain (no .bin, .pt or .pkl: nothing that unpickles).
ALLOWED_FILES = re.compile(
    r"(config\.json|generation_config\.json|model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors\.index\.json"
    r"|tokenizer\.json|tokenizer_config\.json|special_tokens_map\.json|chat_template\.jinja|vocab\.json|merges\.txt"
    r"|added_tokens\.json|optimizer\.safetensors|trainer_state\.json)"
)
MAX_JSON_BYTES = 64 * 1024 * 1024
MAX_FILE_BYTES = 64 * 1024**3


class CheckpointError(ValueError):
    """A checkpoint that must not be loaded; the message says why."""


@dataclass(frozen=True)
class Restored:
    """What :func:`load_latest` found: the round and a local folder with the model files."""

    round: int
    folder: Path


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def optimizer_to_files(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split ``optimizer.state_dict()`` into tensors (for safetensors) and JSON-able scalars."""
    state = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, values in state["state"].items():
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{index}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(index), {})[name] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


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
) -> str:
    """Write a checkpoint of ``round_`` (manifest last) and remove this node's older ones beyond ``keep_last``."""
    folder = layout.checkpoint_dir(node_id, round_)
    with tempfile.TemporaryDirectory(prefix="swarm-ckpt-") as tmp:
        local = Path(tmp)
        model.save_pretrained(local, safe_serialization=True)
        tokenizer.save_pretrained(local)
        tensors, meta = optimizer_to_files(optimizer)
        save_file({**tensors, **rng_tensors()}, str(local / OPTIMIZER_FILE))
        py_version, py_state, py_gauss = random.getstate()
        meta.update({"round": round_, "python_rng": [py_version, list(py_state), py_gauss], "extra": extra or {}})
        (local / STATE_FILE).write_text(json.dumps(meta))
        files = {}
        for path in sorted(local.iterdir()):
            if not path.is_file() or not ALLOWED_FILES.fullmatch(path.name):
                continue
            data = path.read_bytes()
            storage.write_bytes(f"{folder}/{path.name}", data)
            files[path.name] = {"size": len(data), "sha256": _sha256(data)}
    manifest = {"kind": "checkpoint", "schema_version": 1, "node_id": node_id, "round": round_, "files": files}
    storage.write_bytes(f"{folder}/{MANIFEST}", json.dumps(manifest, sort_keys=True).encode())
    _prune(storage, layout, node_id, keep_last, keep=round_)
    return folder


def _rounds(storage: Storage, layout: Layout, node_id: str) -> list[int]:
    base = layout.checkpoint_dir(node_id, 0).rsplit("/", 1)[0]
    return sorted(r for info in storage.list(base) if info.is_dir and (r := parse_round_dir(info.name)) is not None)


def _prune(storage: Storage, layout: Layout, node_id: str, keep_last: int, keep: int) -> None:
    """Keep the checkpoint just written (``keep``) and the newest ``keep_last - 1`` whole ones before it.

    Only folders older than ``keep`` are removed, and only whole checkpoints (a manifest that passes
    its checks) count towards ``keep_last``: a save interrupted by a kill, or a folder someone else
    planted, would otherwise take the place of a good checkpoint that a later restart needs.
    """
    older = [r for r in _rounds(storage, layout, node_id) if r < keep]
    kept: set[int] = set()
    for round_ in reversed(older):  # newest first; a manifest is read only until enough whole ones are found
        if len(kept) >= keep_last - 1:
            break
        if _is_whole(storage, layout, node_id, round_):
            kept.add(round_)
    for round_ in older:
        if round_ in kept:
            continue
        folder = layout.checkpoint_dir(node_id, round_)
        names = [i.name for i in storage.list(folder, include_hidden=True)]
        for name in sorted(names, key=lambda n: n == MANIFEST, reverse=True):  # manifest first: never half-valid
            storage.delete(f"{folder}/{name}")
        storage.remove_empty_dir(folder)


def _is_whole(storage: Storage, layout: Layout, node_id: str, round_: int) -> bool:
    try:
        _read_manifest(storage, layout.checkpoint_dir(node_id, round_), node_id, round_)
    except (CheckpointError, OSError):
        return False
    return True


def _read_manifest(storage: Storage, folder: str, node_id: str, round_: int) -> dict[str, Any]:
    try:
        manifest = json.loads(storage.read_bytes(f"{folder}/{MANIFEST}", MAX_JSON_BYTES))
    except FileNotFoundError:
        raise CheckpointError("no manifest (incomplete checkpoint)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"manifest is not JSON: {exc}") from None
    if (
        not isinstance(manifest, dict)
        or manifest.get("kind") != "checkpoint"
        or manifest.get("round") != round_
        or manifest.get("node_id") != node_id
        or not isinstance(manifest.get("files"), dict)
    ):
        raise CheckpointError("manifest does not describe this node's checkpoint of this round")
    for name, entry in manifest["files"].items():
        if not isinstance(name, str) or not ALLOWED_FILES.fullmatch(name):
            raise CheckpointError(f"file {name!r} is not an allowed checkpoint file (safetensors and JSON only)")
        if not isinstance(entry, dict) or not isinstance(entry.get("size"), int) or entry["size"] > MAX_FILE_BYTES:
            raise CheckpointError(f"file {name!r} has no valid size")
    if OPTIMIZER_FILE not in manifest["files"] or STATE_FILE not in manifest["files"]:
        raise CheckpointError("manifest lacks the optimizer or trainer state")
    names = set(manifest["files"])
    if "config.json" not in names or not ({"model.safetensors", "model.safetensors.index.json"} & names):
        raise CheckpointError("manifest lacks the model (config.json and model safetensors)")
    return manifest


def load_latest(
    storage: Storage, layout: Layout, node_id: str, into: Path, before: int | None = None
) -> Restored | None:
    """Download this node's newest valid checkpoint into ``into``; None if there is none.

    A checkpoint that fails any check is skipped with a logged reason and the next older one is tried.
    """
    for round_ in reversed(_rounds(storage, layout, node_id)):
        if before is not None and round_ >= before:
            continue
        folder = layout.checkpoint_dir(node_id, round_)
        target = into / f"round_{round_}"
        try:
            manifest = _read_manifest(storage, folder, node_id, round_)
            target.mkdir(parents=True, exist_ok=True)
            for name, entry in manifest["files"].items():
                data = storage.read_bytes(f"{folder}/{name}", entry["size"])
                if len(data) != entry["size"] or _sha256(data) != entry.get("sha256"):
                    raise CheckpointError(f"{name} does not match the manifest (size or sha256)")
                (target / name).write_bytes(data)
        except (CheckpointError, FileNotFoundError, OSError) as exc:
            logger.warning("skipping checkpoint %s: %s", folder, exc)
            continue
        return Restored(round_, target)
    return None


def read_extra(folder: Path) -> dict[str, Any]:
    """The workload's own JSON state saved with a checkpoint (e.g. curriculum levels)."""
    extra = json.loads((folder / STATE_FILE).read_text()).get("extra", {})
    return extra if isinstance(extra, dict) else {}


def restore_training_state(folder: Path, optimizer: torch.optim.Optimizer) -> int:
    """Load optimizer and RNG states from a restored folder; returns the checkpoint's round."""
    meta = json.loads((folder / STATE_FILE).read_text())
    tensors = load_file(str(folder / OPTIMIZER_FILE))
    optimizer.load_state_dict(optimizer_from_files(tensors, meta))
    if "rng.torch" in tensors:
        torch.set_rng_state(tensors["rng.torch"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("rng.cuda."))]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    version, state, gauss = meta["python_rng"]
    random.setstate((version, tuple(state), gauss))
    return int(meta["round"])
