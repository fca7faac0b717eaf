"""Fuzzing the checkpoint manifest reader (hypothesis): whatever bytes or JSON shape sits in ``checkpoint.json``,
parsing gives a typed manifest or a CheckpointError, and loading and pruning skip it with a reason; never another
exception. Bounded (examples and deadlines) so the module runs in seconds."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from swarm_gdrive.protocol.layout import Layout  # noqa: E402
from swarm_gdrive.storage import LocalStorage  # noqa: E402
from swarm_gdrive.training import checkpoint  # noqa: E402
from swarm_gdrive.training.checkpoint import CheckpointError, Manifest, parse_manifest  # noqa: E402

LAYOUT = Layout("fuzz")
FAST = settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
FILES = ("config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json")

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([-1, 0, 2**63, checkpoint.MAX_FILE_BYTES + 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["checkpoint", "w1", "0" * 64, "round_1", "../x", "model.bin", "config.json"]),
)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
)


def valid_body(round_: int = 2) -> dict:
    files = {name: {"size": 1, "sha256": "0" * 64} for name in FILES}
    return {
        "kind": "checkpoint",
        "schema_version": 2,
        "node_id": "w1",
        "run_id": "0123456789abcdef",
        "round": round_,
        "complete": True,
        "files": files,
    }


@st.composite
def mutated_manifests(draw: st.DrawFn) -> bytes:
    """A valid manifest with one field (or one file entry, or one of its fields) replaced or removed."""
    body = valid_body()
    where = draw(st.sampled_from([*body, "files.entry", "files.entry.size", "files.entry.sha256", "files.name"]))
    value = draw(json_values)
    if where == "files.entry":
        body["files"]["config.json"] = value
    elif where.startswith("files.entry."):
        body["files"]["config.json"][where.rsplit(".", 1)[1]] = value
    elif where == "files.name":
        body["files"][draw(st.text(max_size=30))] = {"size": 1, "sha256": "0" * 64}
    elif draw(st.booleans()):
        del body[where]
    else:
        body[where] = value
    text = json.dumps(body, allow_nan=True)
    if draw(st.booleans()):  # JSON allows integers Python refuses to convert (more than 4,300 digits)
        text = text.replace('"round": 2', '"round": 2' + "0" * draw(st.integers(4300, 5000)))
    return text.encode()


nested = st.integers(min_value=1, max_value=300_000).map(lambda n: b"[" * n + b"]" * n)
anything = st.one_of(
    st.binary(max_size=2048), mutated_manifests(), nested, json_values.map(lambda v: json.dumps(v).encode())
)


def check(manifest: Manifest) -> None:
    """What a parsed manifest guarantees to its users, whatever it was parsed from."""
    assert isinstance(manifest.node_id, str) and type(manifest.round) is int and manifest.round >= 0
    assert type(manifest.complete) is bool and (manifest.run_id is None or isinstance(manifest.run_id, str))
    for name, entry in manifest.files.items():
        assert checkpoint.ALLOWED_FILES.fullmatch(name)
        assert type(entry.size) is int and 0 <= entry.size <= checkpoint.MAX_FILE_BYTES
        assert isinstance(entry.sha256, str) and len(entry.sha256) == 64


@FAST
@given(anything)
def test_parse_manifest_gives_a_manifest_or_a_checkpoint_error(data: bytes) -> None:
    try:
        manifest = parse_manifest(data)
    except CheckpointError as exc:
        assert str(exc)
        return
    check(manifest)


@FAST
@given(st.integers(min_value=4301, max_value=20_000), st.sampled_from(["round", "size", "schema_version"]))
def test_integers_past_the_conversion_limit_are_a_checkpoint_error(digits: int, field: str) -> None:
    """JSON allows them; Python's int conversion refuses more than 4,300 digits with a plain ValueError."""
    text = json.dumps(valid_body()).replace(f'"{field}": ', f'"{field}": {"9" * digits}', 1)
    with pytest.raises(CheckpointError, match="not JSON"):
        parse_manifest(text.encode())


def whole_checkpoint(storage: LocalStorage, round_: int) -> None:
    folder = LAYOUT.checkpoint_dir("w1", round_)
    entries = {}
    for name in FILES:
        storage.write_bytes(f"{folder}/{name}", b"{}")
        entries[name] = {"size": 2, "sha256": checkpoint._sha256(b"{}")}
    body = {**valid_body(round_), "run_id": None, "files": entries}
    storage.write_bytes(f"{folder}/{checkpoint.MANIFEST}", json.dumps(body).encode())


@settings(max_examples=60, deadline=5000, suppress_health_check=[HealthCheck.too_slow])
@given(anything)
def test_loading_and_pruning_skip_any_manifest_with_a_reason(data: bytes) -> None:
    """Round 1 is whole; round 2's manifest is fuzzed: loading falls back to round 1 and pruning never raises."""
    logger = logging.getLogger("swarm_gdrive.training.checkpoint")
    with tempfile.TemporaryDirectory() as tmp:
        storage = LocalStorage(Path(tmp) / "drive")
        whole_checkpoint(storage, 1)
        folder = LAYOUT.checkpoint_dir("w1", 2)
        storage.write_bytes(f"{folder}/config.json", b"{}")
        storage.write_bytes(f"{folder}/{checkpoint.MANIFEST}", data)
        records: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = records.append  # type: ignore[method-assign]
        logger.addHandler(handler)
        try:
            restored = checkpoint.load_latest(storage, LAYOUT, "w1", Path(tmp) / "restore")
            checkpoint._prune(storage, LAYOUT, "w1", keep_last=1, keep=3)
        finally:
            logger.removeHandler(handler)
        assert restored is not None and restored.round == 1
        assert any(r.getMessage().startswith(f"skipping checkpoint {folder}: ") for r in records)


# -- sizes that lie (issue 30, class 2) ----------------------------------------------------------------------------


class CountingStorage(LocalStorage):
    """A local folder that keeps the path of every read (whole or streamed): what a refusal must not have read."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: list[str] = []

    def read_bytes(self, path: str, max_bytes: int | None = None) -> bytes:
        self.reads.append(path)
        return super().read_bytes(path, max_bytes)

    def read_chunks(self, path: str, max_bytes: int, chunk_bytes: int = 1 << 20):
        self.reads.append(path)
        return super().read_chunks(path, max_bytes, chunk_bytes)


@st.composite
def lying_sizes(draw: st.DrawFn) -> tuple[checkpoint.SizeLimits, str, int, int]:
    """A model's bounds, a file of round 2's checkpoint, the size its manifest claims and the file's real size:
    either a claim over the file's bound (the real size that claim, or a few bytes), or a claim within it that is
    not the real size."""
    limits = checkpoint.SizeLimits(draw(st.integers(2, 2**36)), draw(st.integers(2, 2**36)))  # round 1: 2 bytes a file
    name = draw(st.sampled_from(["model.safetensors", "adapter_model.safetensors", "optimizer.safetensors", *FILES]))
    bound = limits.bound(name)
    if bound < checkpoint.MAX_FILE_BYTES and draw(st.booleans()):
        claimed = draw(st.integers(bound + 1, checkpoint.MAX_FILE_BYTES))
        real = draw(st.sampled_from([claimed, 0, 2]))
    else:
        claimed = draw(st.integers(0, min(bound, 2**34)))
        real = draw(st.integers(0, 2**34).filter(lambda n: n != claimed))
    return limits, name, claimed, real


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lying_sizes())
def test_a_size_over_the_models_bound_or_not_the_real_one_is_refused_before_a_byte_is_read(case) -> None:
    """Round 2's manifest claims a size over the model's bound for one of its files (sparse, up to 64 GiB), or a
    size within it that the file does not have: loading skips round 2, naming the file, without reading any of its
    files (only its manifest), and restores round 1."""
    limits, name, claimed, real = case
    logger = logging.getLogger("swarm_gdrive.training.checkpoint")
    with tempfile.TemporaryDirectory() as tmp:
        storage = CountingStorage(Path(tmp) / "drive")
        whole_checkpoint(storage, 1)
        folder = LAYOUT.checkpoint_dir("w1", 2)
        entries = {}
        for other in FILES:
            storage.write_bytes(f"{folder}/{other}", b"{}")
            entries[other] = {"size": 2, "sha256": checkpoint._sha256(b"{}")}
        storage.write_bytes(f"{folder}/{name}", b"")
        with open(Path(tmp) / "drive" / folder / name, "r+b") as fh:
            fh.truncate(real)  # sparse: no disk taken, whatever the size
        entries[name] = {"size": claimed, "sha256": "0" * 64}
        body = {**valid_body(2), "run_id": None, "files": entries}
        storage.write_bytes(f"{folder}/{checkpoint.MANIFEST}", json.dumps(body).encode())
        records: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = records.append  # type: ignore[method-assign]
        logger.addHandler(handler)
        try:
            restored = checkpoint.load_latest(storage, LAYOUT, "w1", Path(tmp) / "restore", limits=limits)
        finally:
            logger.removeHandler(handler)
        assert restored is not None and restored.round == 1
        read = [p for p in storage.reads if p.startswith(folder + "/") and not p.endswith(checkpoint.MANIFEST)]
        assert not read, read
        skipped = [r.getMessage() for r in records if r.getMessage().startswith(f"skipping checkpoint {folder}: ")]
        assert skipped and name in skipped[0], skipped
