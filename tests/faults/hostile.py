"""Hostile and broken files that anyone with write access to the shared folder can plant, and the reason
each reader must give when it rejects one."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import (
    PeerRecord,
    Provenance,
    RewardRecord,
    RolloutBatch,
    RolloutGroup,
    StateRecord,
    encode,
)
from swarm_gdrive.protocol.workload import SYNTHETIC_DATASET, SyntheticWorkload

GIB = 1024**3
#: What a reader says of a file holding an integer literal longer than Python's int conversion limit.
HUGE_REASON = "not JSON (an integer of more than 4300 digits)"
FORGED_QUESTION, FORGED_PROVENANCE, FORGED_REWARDS = "forged-question", "forged-provenance", "forged-rewards"


def _group(
    group_id: str, seed: int, index: int, completions: list[str], rewards: list[float], **change
) -> RolloutGroup:
    question, _ = SyntheticWorkload.question(seed, index)
    fields = {
        "group_id": group_id,
        "task": SYNTHETIC_DATASET,
        "question": question,
        "provenance": Provenance(dataset=SYNTHETIC_DATASET, seed=seed, index=index),
        "completions": completions,
        "rewards": rewards,
    }
    return RolloutGroup(**{**fields, **change})


def forged_batch(node: str, run_id: str, round_: int, seed: int) -> RolloutBatch:
    """A schema-valid batch whose groups lie: a question that is not the one its provenance gives, a
    provenance of a dataset nobody has, and true completions whose claimed rewards are inverted."""
    _, answer = SyntheticWorkload.question(seed, 7)
    right, wrong = str(answer), str(answer + 1)
    groups = [
        _group(FORGED_QUESTION, seed, 5, ["4", "5", "4", "5"], [1.0, 0.0, 1.0, 0.0], question="What is 2 + 2?"),
        _group(
            FORGED_PROVENANCE,
            seed,
            6,
            ["1", "2", "1", "2"],
            [1.0, 0.0, 1.0, 0.0],
            provenance=Provenance(dataset="evil", seed=seed, index=6),
            task="evil",
        ),
        # Claims the wrong answers are right: the local verifier must score them 0.
        _group(FORGED_REWARDS, seed, 7, [wrong, right, wrong, wrong], [1.0, 0.0, 1.0, 1.0]),
    ]
    return RolloutBatch(node_id=node, run_id=run_id, round=round_, stage=0, groups=groups, created_at=time.time())


def flood_batch(node: str, run_id: str, round_: int, seed: int, groups: int, per_group: int) -> RolloutBatch:
    """``groups`` valid groups of ``per_group`` identical completions each (zero variance: never trained on)."""
    made = [_group(f"g{i}", seed, 1000 + i, ["0"] * per_group, [1.0] * per_group) for i in range(groups)]
    return RolloutBatch(node_id=node, run_id=run_id, round=round_, stage=0, groups=made, created_at=time.time())


def state_record(run_id: str) -> StateRecord:
    now = time.time()
    return StateRecord(
        experiment="faults",
        run_id=run_id,
        round=999,
        status="finished",
        seq=10**6,
        max_rounds=1000,
        num_stages=1,
        round_opened_at=now,
        round_deadline=now,
        coordinator_id="coord",
        updated_at=now,
    )


def plant(
    folder: Path,
    rel: str,
    data: bytes | None = None,
    *,
    sparse: int = 0,
    link: str = "",
    fifo: bool = False,
    directory: bool = False,
) -> str:
    """Put ``data`` (or a sparse file, a link, a FIFO, a folder) at ``rel``; returns ``rel``."""
    target = folder / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    if directory:
        target.mkdir()
    elif sparse:
        with open(target, "wb") as fh:
            fh.truncate(sparse)  # a 1 GiB file that takes no disk
    elif link:
        os.symlink(link, target)
    elif fifo:
        os.mkfifo(target)
    else:  # whole or not at all, as a node writes: a running reader must see the planted bytes, not half of them
        hidden = target.with_name(f".{target.name}.plant.tmp")
        hidden.write_bytes(data or b"")
        os.replace(hidden, target)
    return rel


def huge_int(kind: str) -> bytes:
    """The 5 KB file of issue 14: valid JSON of a kind whose integer literal has 5,000 digits, more than Python's
    int conversion allows (``json.loads`` raises a plain ValueError)."""
    return f'{{"schema_version":1,"kind":"{kind}","round":{"9" * 5000}}}'.encode()


def stopped_worker(node: str, run_id: str) -> PeerRecord:
    """A valid peer record of a worker of this run that has stopped: registered, so its rollouts are read, and
    never live, so the coordinator does not wait for it."""
    now = time.time()
    return PeerRecord(
        node_id=node,
        role="worker",
        run_id=run_id,
        registered_at=now,
        heartbeat=1,
        heartbeat_at=now,
        status="stopped",
    )


def alive_worker(node: str, run_id: str, round_: int, heartbeat: int) -> PeerRecord:
    """A valid peer record of a live worker of this run at ``round_``: an asynchronous pickup reads its rollouts of
    that round (and the round before), and the coordinator counts it live while the file keeps changing."""
    now = time.time()
    return PeerRecord(
        node_id=node,
        role="worker",
        run_id=run_id,
        registered_at=now,
        heartbeat=heartbeat,
        heartbeat_at=now,
        status="alive",
        round=round_,
    )


def plant_rollouts(folder: Path, layout: Layout, run_id: str, round_: int, seed: int) -> dict[str, str]:
    """Broken and hostile rollout files of one round, under registered names (a gather reads only those), and a
    valid batch of a name that never registered (``stranger``: never read); returns path -> the reason a reader
    must give."""
    good = encode(forged_batch("trunc", run_id, round_, seed))
    flood = flood_batch("flood", run_id, round_, seed, 1, 4).model_dump(mode="json")
    flood["groups"][0].update(completions=["0"] * 10_000, rewards=[1.0] * 10_000)  # the schema allows 64
    pathy = json.loads(encode(forged_batch("pathy", run_id, round_, seed)))
    schema = json.loads(encode(forged_batch("schema", run_id, round_, seed)))
    schema["groups"], schema["exec"] = "lots", "__import__('os').system('touch pwned')"
    pathy["node_id"] = "../../x"

    def at(name: str) -> str:
        return layout.rollout_file(round_, 0, name)

    expected = {
        plant(folder, at("trunc"), good[: len(good) // 2]): "not JSON",
        plant(folder, at("badutf"), b'{"kind": "rollouts", "x": "\xff\xfe\xfa"}'): "not UTF-8",
        plant(folder, at("huge"), sparse=GIB): f"{GIB} bytes exceeds",
        plant(folder, at("schema"), json.dumps(schema).encode()): "schema: ",
        plant(folder, at("flood"), json.dumps(flood).encode()): "completions: List should have at most 64 items",
        plant(folder, at("pathy"), json.dumps(pathy).encode()): "schema: node_id: String should match pattern",
        plant(folder, at("linkdir"), link=str(folder)): "a symbolic link, not a regular file",
        plant(folder, at("fifo"), fifo=True): "a FIFO, not a regular file",
        plant(folder, at("stately"), encode(state_record(run_id))): "kind is 'state', expected 'rollouts'",
    }
    plant(folder, at("forger"), encode(forged_batch("forger", run_id, round_, seed)))
    plant(folder, at("many"), encode(flood_batch("many", run_id, round_, seed, 200, 50)))  # 10,000 completions
    for name in [*(rel.rsplit("/", 1)[-1][: -len(".json")] for rel in expected), "forger", "many"]:
        if not (folder / layout.peer_file(name)).exists():
            plant(folder, layout.peer_file(name), encode(stopped_worker(name, run_id)))
    plant(folder, at("stranger"), encode(forged_batch("stranger", run_id, round_, seed)))
    return expected


def plant_for_coordinator(folder: Path, layout: Layout, run_id: str, rounds: int) -> dict[str, str]:
    """Hostile peer and reward files (the coordinator reads these); returns path -> reason."""
    now = time.time()
    fake = PeerRecord(
        node_id="fakecoord",
        role="coordinator",
        run_id=run_id,
        registered_at=now,
        heartbeat=1,
        heartbeat_at=now,
        status="alive",
    )
    plant(folder, layout.peer_file("fakecoord"), encode(fake))  # valid: a second "coordinator", never a worker
    pathy = json.loads(encode(fake.model_copy(update={"node_id": "p-pathy", "role": "worker"})))
    pathy["node_id"] = "../../x"
    expected = {  # names other than plant_rollouts' registered ones
        plant(folder, layout.peer_file("p-stately"), encode(state_record(run_id))): "kind is 'state', expected 'peer'",
        plant(folder, layout.peer_file("p-huge"), sparse=GIB): f"{GIB} bytes exceeds",
        plant(folder, layout.peer_file("p-pathy"), json.dumps(pathy).encode()): "schema: node_id",
        plant(folder, layout.peer_file("p-fifo"), fifo=True): "a FIFO, not a regular file",
    }
    for round_ in range(rounds):
        ghost = RewardRecord(
            node_id="ghost",
            run_id=run_id,
            round=round_,
            stage=0,
            reward=1.0,
            num_local_groups=1,
            num_external_groups=0,
            external_requested=0,
            submitted_at=now,
        )
        plant(folder, layout.reward_file(round_, 0, "ghost"), encode(ghost))  # never registered: never counts
        rel = plant(folder, layout.reward_file(round_, 0, "stately"), encode(state_record(run_id)))
        expected[rel] = "kind is 'state', expected 'reward'"
    return expected
