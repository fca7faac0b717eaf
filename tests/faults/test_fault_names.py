"""Names that are not portable across the stores a swarm shares: names that differ only in case are one file on
Drive for desktop (macOS, Windows), and Windows reserves device names and drops a trailing dot. Such a NODE_ID or
EXPERIMENT_NAME is refused before anything is written (exit 2, one line naming the variable and the fix); and a
node's pruning never deletes the checkpoints that a name colliding by case put in its folder."""

from __future__ import annotations

import json

import pytest
from faultkit import LAYOUT, Swarm, swarm_env

from swarm_gdrive.storage import LocalStorage

pytestmark = [pytest.mark.integration]

REFUSED = {
    "W1": ("NODE_ID", "use lowercase, e.g. 'w1'"),
    "con": ("NODE_ID", "Windows reserves con, prn, aux, nul"),
    "aux.json": ("NODE_ID", "Windows reserves"),
    "lpt1": ("NODE_ID", "Windows reserves"),
    "w1.": ("NODE_ID", "do not end it with '.'"),
}


@pytest.mark.slow
def test_names_that_are_not_portable_are_refused_before_anything_is_written(tmp_path):
    folder = tmp_path / "drive"
    folder.mkdir()
    swarm = Swarm(folder, swarm_env(folder, COORDINATOR_WAIT_TIMEOUT=20), [])
    try:
        procs = {name: swarm.start(f"node-{i}", node=name) for i, name in enumerate(REFUSED)}
        procs["Exp"] = swarm.start("experiment", node="w9", EXPERIMENT_NAME="My-Run")
        codes = {name: proc.wait(timeout=60) for name, proc in procs.items()}
    finally:
        swarm.stop()
    assert codes == {name: 2 for name in procs}, swarm.tails()
    for name, (var, fix) in [*REFUSED.items(), ("Exp", ("EXPERIMENT_NAME", "use lowercase, e.g. 'my-run'"))]:
        value = "My-Run" if name == "Exp" else name
        errors = [line for line in procs[name].lines if "error:" in line]
        assert len(errors) == 1 and f"{var}={value!r}: " in errors[0] and fix in errors[0], procs[name].lines[-5:]
    assert not list(folder.iterdir())  # nothing written to the shared folder


class CaseFoldingStorage(LocalStorage):
    """Drive for desktop on macOS or Windows: every path names the same file whatever its case (a test double).

    Real case-insensitive stores keep the first spelling; lowercasing every path gives the same collisions.
    """

    def read_bytes(self, path: str, max_bytes: int = 16 * 1024 * 1024) -> bytes:
        return super().read_bytes(path.lower(), max_bytes)

    def write_bytes(self, path: str, data: bytes) -> None:
        super().write_bytes(path.lower(), data)

    def move_in(self, path: str, local) -> bool:  # noqa: ANN001 - LocalStorage's own signature
        return super().move_in(path.lower(), local)

    def list(self, folder: str, include_hidden: bool = False):
        return super().list(folder.lower(), include_hidden)

    def delete(self, path: str) -> None:
        super().delete(path.lower())

    def remove_empty_dir(self, folder: str) -> bool:
        return super().remove_empty_dir(folder.lower())


@pytest.mark.usefixtures("one_thread")
def test_pruning_never_deletes_the_checkpoints_of_a_name_that_collided_by_case(tmp_path, tiny_folder):
    """Node "W1" (accepted by earlier versions) saved checkpoints of rounds 0 and 1; on a case-folding store they
    sit in w1's folder. When w1 saves round 2 with KEEP_CHECKPOINTS=1, its pruning must leave them: their
    manifest names W1, not w1. Earlier, pruning deleted every folder under the name that was not w1's whole
    checkpoint."""
    import torch

    from swarm_gdrive.training import checkpoint
    from swarm_gdrive.training.models import load_model_and_tokenizer

    storage = CaseFoldingStorage(tmp_path)
    model, tokenizer = load_model_and_tokenizer(str(tiny_folder), torch.device("cpu"), torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    other = LAYOUT.checkpoint_dir("w1", 0).replace("/w1/", "/W1/").rsplit("/", 1)[0]
    for round_ in (0, 1):  # what W1 wrote, spelled as W1 wrote it
        entries = {"config.json": {"size": 2, "sha256": "0" * 64}}
        body = {"kind": "checkpoint", "schema_version": 1, "node_id": "W1", "round": round_, "files": entries}
        storage.write_bytes(f"{other}/round_{round_}/config.json", b"{}")
        storage.write_bytes(f"{other}/round_{round_}/checkpoint.json", json.dumps(body).encode())
    checkpoint.save(storage, LAYOUT, "w1", 2, model, tokenizer, optimizer, keep_last=1)
    base = tmp_path / LAYOUT.checkpoint_dir("w1", 0).rsplit("/", 1)[0]
    assert sorted(p.name for p in base.iterdir()) == ["round_0", "round_1", "round_2"]
    for round_ in (0, 1):
        assert json.loads((base / f"round_{round_}" / "checkpoint.json").read_text())["node_id"] == "W1"
