"""identity.claim_identity: explicit, generated, reused and concurrent node identities."""

from __future__ import annotations

import json
import multiprocessing
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from swarm_gdrive.names import InvalidNameError
from swarm_gdrive.protocol.identity import Identity, IdentityError, claim_identity

EXP = "exp1"


@pytest.fixture
def local_dir(tmp_path: Path) -> str:
    return str(tmp_path / "local")


@pytest.fixture
def held() -> Iterator[list[Identity]]:
    """Identities to release at the end of a test, so that no lock outlives it."""
    identities: list[Identity] = []
    yield identities
    for identity in identities:
        identity.release()  # a second release does nothing


def claim(held: list[Identity], local_dir: str, role: str = "worker", node_id: str | None = None) -> Identity:
    identity = claim_identity(local_dir, EXP, role, node_id)
    held.append(identity)
    return identity


def identities_dir(local_dir: str) -> Path:
    return Path(local_dir) / EXP / "identities"


def test_explicit_node_id(local_dir: str, held: list[Identity]) -> None:
    identity = claim(held, local_dir, "worker", "alice")
    assert identity.node_id == "alice"
    assert identity.generated is False
    assert identity.path == identities_dir(local_dir) / "alice.id"
    assert json.loads(identity.record.read_text()) == {"role": "worker"}


def test_same_node_id_twice_conflicts(local_dir: str, held: list[Identity]) -> None:
    claim(held, local_dir, "worker", "alice")
    with pytest.raises(IdentityError) as info:
        claim_identity(local_dir, EXP, "worker", "alice")
    assert str(info.value) == (
        "NODE_ID='alice': another running process on this machine already is this node; "
        "stop it first or choose another NODE_ID"
    )


def _claim_and_report(local_dir: str, node_id: str | None, queue: Any, release: Any) -> None:
    try:
        identity = claim_identity(local_dir, EXP, "worker", node_id)
    except IdentityError as exc:
        queue.put(("error", str(exc)))
        return
    queue.put(("ok", identity.node_id))
    release.wait(timeout=20)
    identity.release()


def test_same_node_id_held_by_another_process_conflicts(local_dir: str, held: list[Identity]) -> None:
    ctx = multiprocessing.get_context("fork")
    queue, release = ctx.Queue(), ctx.Event()
    other = ctx.Process(target=_claim_and_report, args=(local_dir, "alice", queue, release))
    other.start()
    try:
        assert queue.get(timeout=20) == ("ok", "alice")
        with pytest.raises(IdentityError, match=r"^NODE_ID='alice': another running process"):
            claim_identity(local_dir, EXP, "worker", "alice")
    finally:
        release.set()
        other.join(timeout=20)
    assert other.exitcode == 0
    assert claim(held, local_dir, "worker", "alice").node_id == "alice"  # free once the process let go


def test_released_node_id_can_be_claimed_again(local_dir: str, held: list[Identity]) -> None:
    first = claim_identity(local_dir, EXP, "worker", "alice")
    first.release()
    second = claim(held, local_dir, "worker", "alice")
    assert second.node_id == "alice"


def test_an_identity_released_by_another_thread_is_free(local_dir: str, held: list[Identity]) -> None:
    """The launcher may stop a node from another thread than the one that claimed it."""
    import threading

    first = claim_identity(local_dir, EXP, "worker", "alice")
    releaser = threading.Thread(target=first.release)
    releaser.start()
    releaser.join()
    assert claim(held, local_dir, "worker", "alice").node_id == "alice"
    first.release()  # a second release does nothing: the new holder keeps its identity
    with pytest.raises(IdentityError):
        claim_identity(local_dir, EXP, "worker", "alice")


def test_invalid_names_rejected(local_dir: str) -> None:
    with pytest.raises(InvalidNameError, match=r"^NODE_ID='\.\./x': "):
        claim_identity(local_dir, EXP, "worker", "../x")
    with pytest.raises(InvalidNameError, match=r"^EXPERIMENT_NAME='a/b': "):
        claim_identity(local_dir, "a/b", "worker", None)
    assert not (Path(local_dir).parent / "x.id").exists()


def test_generated_identity_is_persisted_and_reused(local_dir: str, held: list[Identity]) -> None:
    first = claim_identity(local_dir, EXP, "worker", None)
    assert first.generated is True
    assert re.fullmatch(r"worker-[0-9a-f]{6}", first.node_id)
    assert first.path == identities_dir(local_dir) / f"{first.node_id}.id"
    assert json.loads(first.record.read_text()) == {"role": "worker"}
    first.release()
    again = claim(held, local_dir, "worker", None)
    assert again.node_id == first.node_id
    assert again.generated is True
    # the .lock file stays after a release on POSIX (Windows removes it): nothing else, no temporary left
    assert {p.name for p in identities_dir(local_dir).iterdir()} - {f"{first.node_id}.lock"} == {
        f"{first.node_id}.{x}" for x in ("id", "json")
    }


def test_held_generated_identity_is_not_shared(local_dir: str, held: list[Identity]) -> None:
    first = claim(held, local_dir, "worker", None)
    second = claim(held, local_dir, "worker", None)
    assert first.node_id != second.node_id
    assert second.node_id.startswith("worker-")
    assert len(list(identities_dir(local_dir).glob("*.id"))) == 2


def test_concurrent_claims_get_different_ids(local_dir: str) -> None:
    # one released identity exists: exactly one of the three processes reuses it
    claim_identity(local_dir, EXP, "worker", None).release()
    existing = {p.stem for p in identities_dir(local_dir).glob("*.id")}
    ctx = multiprocessing.get_context("fork")
    queue, release = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_claim_and_report, args=(local_dir, None, queue, release)) for _ in range(3)]
    for proc in procs:
        proc.start()
    try:
        results = [queue.get(timeout=20) for _ in procs]
    finally:
        release.set()
        for proc in procs:
            proc.join(timeout=20)
    assert [status for status, _ in results] == ["ok", "ok", "ok"]
    ids = {node_id for _, node_id in results}
    assert len(ids) == 3
    assert existing <= ids
    assert all(proc.exitcode == 0 for proc in procs)


def test_worker_never_reuses_a_coordinator_identity(local_dir: str, held: list[Identity]) -> None:
    coordinator = claim_identity(local_dir, EXP, "coordinator", None)
    assert coordinator.node_id.startswith("coordinator-")
    coordinator.release()
    worker = claim(held, local_dir, "worker", None)
    assert worker.node_id.startswith("worker-")
    assert worker.node_id != coordinator.node_id
    assert json.loads(coordinator.record.read_text()) == {"role": "coordinator"}  # left as it was
    worker.release()
    coordinator_again = claim(held, local_dir, "coordinator", None)
    assert coordinator_again.node_id == coordinator.node_id


def test_explicit_identity_is_reused_by_role(local_dir: str, held: list[Identity]) -> None:
    claim_identity(local_dir, EXP, "coordinator", "boss").release()
    assert claim(held, local_dir, "worker", None).node_id != "boss"
    assert claim(held, local_dir, "coordinator", None).node_id == "boss"


def test_identities_are_per_experiment(local_dir: str, held: list[Identity]) -> None:
    first = claim(held, local_dir, "worker", "alice")
    other = claim_identity(local_dir, "exp2", "worker", "alice")
    held.append(other)
    assert first.path != other.path
    assert other.path == Path(local_dir) / "exp2" / "identities" / "alice.id"


def test_write_local_read_local(local_dir: str, held: list[Identity]) -> None:
    identity = claim(held, local_dir, "worker", "alice")
    assert identity.read_local() == {"role": "worker"}
    identity.write_local(last_round=3)
    identity.write_local(last_round=4, note="x")
    assert identity.read_local() == {"role": "worker", "last_round": 4, "note": "x"}
    assert json.loads(identity.record.read_text()) == {"role": "worker", "last_round": 4, "note": "x"}
    identity.release()
    again = claim(held, local_dir, "worker", "alice")
    assert again.read_local() == {"role": "worker", "last_round": 4, "note": "x"}


def test_write_local_shrinks_the_file(local_dir: str, held: list[Identity]) -> None:
    identity = claim(held, local_dir, "worker", "alice")
    identity.write_local(big="x" * 1000)
    identity.write_local(big="y")
    assert json.loads(identity.record.read_text()) == {"role": "worker", "big": "y"}


def test_read_local_of_a_corrupt_file_is_empty(local_dir: str, held: list[Identity]) -> None:
    folder = identities_dir(local_dir)
    folder.mkdir(parents=True)
    (folder / "alice.id").write_text("{not json")
    identity = claim(held, local_dir, "worker", "alice")
    assert identity.read_local() == {"role": "worker"}  # claiming rewrote the record


def test_generated_identity_skips_corrupt_records(local_dir: str, held: list[Identity]) -> None:
    folder = identities_dir(local_dir)
    folder.mkdir(parents=True)
    (folder / "worker-000000.id").write_text("{not json")
    identity = claim(held, local_dir, "worker", None)
    assert identity.node_id != "worker-000000"
    assert (folder / "worker-000000.id").read_text() == "{not json"


def test_an_empty_identity_file_left_by_a_killed_process_is_removed(tmp_path):
    from swarm_gdrive.protocol.identity import claim_identity

    folder = tmp_path / "exp" / "identities"
    folder.mkdir(parents=True)
    (folder / "worker-dead00.id").write_text("")
    identity = claim_identity(str(tmp_path), "exp", "worker", None)
    try:
        assert identity.node_id != "worker-dead00"
        assert not (folder / "worker-dead00.id").exists()
    finally:
        identity.release()


@pytest.mark.parametrize(
    "content",
    ['{"last_round": ' + "9" * 5000 + "}", "[1, 2]", "[" * 100_000 + "]" * 100_000, b"\xff\xfe".decode("latin-1")],
)
def test_a_local_record_that_is_no_json_object_reads_as_empty(local_dir: str, held: list[Identity], content) -> None:
    """An older version, a crash or a hand edit may leave anything there: a huge integer, a list, deep nesting."""
    folder = identities_dir(local_dir)
    folder.mkdir(parents=True)
    (folder / "worker-000000.id").write_text(content)
    identity = claim(held, local_dir, "worker", None)  # reading it must not raise
    assert identity.node_id != "worker-000000"
    assert claim(held, local_dir, "worker", "alice").read_local() == {"role": "worker"}
    (folder / "alice.json").write_text(content)
    assert held[-1].read_local() == {}


def test_an_older_versions_record_inside_the_lock_file_is_read_then_moved(local_dir: str, held: list[Identity]) -> None:
    folder = identities_dir(local_dir)
    folder.mkdir(parents=True)
    (folder / "worker-0000aa.id").write_text(json.dumps({"role": "worker", "last_round": 7}))
    identity = claim(held, local_dir, "worker", None)
    assert identity.node_id == "worker-0000aa" and identity.read_local()["last_round"] == 7
    identity.write_local(last_round=8)
    assert json.loads(identity.record.read_text()) == {"role": "worker", "last_round": 8}
    assert identity.path.read_text() == ""


_WRITER = """
import sys
from swarm_gdrive.protocol.identity import claim_identity
identity = claim_identity(sys.argv[1], "exp", "worker", "w1")
identity.write_local(last_round=0, pad="x" * 2_000_000)
print("ready", flush=True)
n = 0
while True:
    n += 1
    identity.write_local(last_round=n)
"""


def test_a_process_killed_while_writing_its_record_leaves_a_whole_one(tmp_path) -> None:
    """SIGKILL at random moments of a loop rewriting a 2 MB record: the record read afterwards is always a whole
    one (the version that truncated the file in place, then wrote, left it empty or torn: a lost last_round)."""
    import random
    import signal
    import subprocess
    import sys
    import time

    from swarm_gdrive.protocol.identity import claim_identity

    rng = random.Random(5)
    for trial in range(12):
        child = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.3))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        identity = claim_identity(str(tmp_path), "exp", "worker", "w1")
        try:
            record = identity.read_local()
            assert isinstance(record.get("last_round"), int) and len(record.get("pad", "")) == 2_000_000, (
                trial,
                sorted(record),
            )
        finally:
            identity.release()
