"""records: round trips for every kind and the reason given for every rejection."""

from __future__ import annotations

import json
from typing import Any

import pytest

from swarm_gdrive.protocol.records import (
    MAX_BYTES,
    MAX_COMPLETIONS_PER_GROUP,
    SCHEMA_VERSION,
    EvalRecord,
    EventRecord,
    ExperimentRecord,
    MetricRecord,
    PeerRecord,
    Provenance,
    RecordError,
    RewardRecord,
    RolloutBatch,
    RolloutGroup,
    StateRecord,
    TaskEval,
    decode,
    decode_lines,
    encode,
    encode_checked,
    encode_line,
)

RUN = "0123abcd"
NODE_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


def group(n: int = 3, group_id: str = "g0") -> RolloutGroup:
    return RolloutGroup(
        group_id=group_id,
        task="arithmetic",
        question="What is 2 + 2?",
        provenance=Provenance(dataset="basic_arithmetic", config={"size": 2, "ops": ["+", "-"]}, seed=7, index=3),
        completions=[f"answer {i}" for i in range(n)],
        rewards=[float(i % 2) for i in range(n)],
    )


def state(round_: int = 1, seq: int = 0, status: str = "running") -> StateRecord:
    return StateRecord(
        experiment="exp1",
        run_id=RUN,
        round=round_,
        status=status,
        seq=seq,
        max_rounds=10,
        num_stages=2,
        round_opened_at=100.0,
        round_deadline=160.0,
        live_workers=["w-1", "w-2"],
        advance_reason="all_submitted",
        coordinator_id="coord",
        updated_at=101.5,
    )


def peer() -> PeerRecord:
    return PeerRecord(
        node_id="w-1",
        role="worker",
        run_id=RUN,
        registered_at=10.0,
        heartbeat=4,
        heartbeat_at=50.25,
        status="alive",
        round=3,
    )


def reward() -> RewardRecord:
    return RewardRecord(
        node_id="w-1",
        run_id=RUN,
        round=2,
        stage=1,
        reward=0.625,
        num_local_groups=4,
        num_external_groups=2,
        external_requested=4,
        submitted_at=12.0,
    )


RECORDS: dict[str, Any] = {
    "eval": lambda: EvalRecord(
        node_id="w-1",
        run_id=RUN,
        round=3,
        results=[
            TaskEval(task="chain_sum", level=0, n=16, pass1=0.25, mean_score=0.3),
            TaskEval(task="chain_sum", level=2, n=16, pass1=0.0, mean_score=0.1, k=4, pass_k=0.5),
        ],
        created_at=1.0,
    ),
    "experiment": lambda: ExperimentRecord(
        experiment="exp1",
        run_id=RUN,
        fingerprint="0123456789abcdef",
        config={"SEED": 42, "TEST_MODE": False, "MODEL_NAME": "m", "X": None, "LR": 1e-6},
        coordinator_id="coord",
        created_at=1.0,
    ),
    "state": state,
    "peer": peer,
    "reward": reward,
    "rollouts": lambda: RolloutBatch(
        node_id="w-1",
        run_id=RUN,
        round=2,
        stage=0,
        groups=[group(3, "g0"), group(MAX_COMPLETIONS_PER_GROUP, "g1")],
        complete=False,
        created_at=3.5,
    ),
    "metric": lambda: MetricRecord(node_id="w-1", round=2, ts=5.0, values={"train/loss": 0.5, "swarm/n": 3, "x": None}),
    "event": lambda: EventRecord(
        node_id="w-1",
        round=None,
        ts=6.0,
        event="round_skipped",
        level="warning",
        message="behind by 2 rounds",
        data={"from": 1, "to": 3, "ids": ["a", "b"], "ok": True},
    ),
}


def as_dict(record: Any) -> dict[str, Any]:
    return json.loads(encode(record))


def dumps(raw: Any) -> bytes:
    return json.dumps(raw).encode()


def reject(data: bytes, model: type) -> str:
    with pytest.raises(RecordError) as info:
        decode(data, model)
    return str(info.value)


# -- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(RECORDS))
def test_round_trip(kind: str) -> None:
    record = RECORDS[kind]()
    data = encode(record)
    decoded = decode(data, type(record))
    assert decoded == record
    assert encode(decoded) == data
    raw = json.loads(data)
    assert raw["kind"] == kind
    assert raw["schema_version"] == SCHEMA_VERSION == 1


def test_a_record_its_readers_would_reject_is_never_written(tmp_path) -> None:
    """model_copy does not validate: a state with an advance_reason outside the schema once reached the folder and
    every worker rejected it. The exchange's writer reads each record back as a reader would, and refuses."""
    from swarm_gdrive.protocol.exchange import Exchange
    from swarm_gdrive.protocol.layout import Layout
    from swarm_gdrive.storage import LocalStorage

    bad = state().model_copy(update={"advance_reason": "no_such_reason"})
    with pytest.raises(RecordError):
        decode(encode(bad), StateRecord)  # what a worker would make of it
    with pytest.raises(ValueError, match="refusing to write a state file its readers would reject: .*advance_reason"):
        encode_checked(bad)
    exchange = Exchange(LocalStorage(tmp_path), Layout("exp1"), "coord")
    with pytest.raises(ValueError, match="refusing to write a state file"):
        exchange.write_state(bad)
    assert not list(tmp_path.rglob("*.json"))  # nothing written
    exchange.write_state(state())  # a valid one is
    assert decode((tmp_path / Layout("exp1").state_file).read_bytes(), StateRecord) == state()


def test_encode_is_compact_utf8() -> None:
    record = EventRecord(node_id="w", ts=1.0, event="e", message="héllo ✓")
    data = encode(record)
    assert b"\n" not in data and b": " not in data
    assert decode(data, EventRecord).message == "héllo ✓"
    assert encode_line(record) == data + b"\n"


def test_int_accepted_where_float_expected() -> None:
    raw = as_dict(reward()) | {"reward": 1, "submitted_at": 12}
    decoded = decode(dumps(raw), RewardRecord)
    assert decoded.reward == 1.0 and decoded.submitted_at == 12.0


# -- rejections ------------------------------------------------------------------------------


def test_truncated_json() -> None:
    data = encode(peer())
    assert reject(data[:20], PeerRecord).startswith("not JSON (")
    assert reject(b'{"kind": "peer"', PeerRecord) == "not JSON (Expecting ',' delimiter at line 1 column 16)"
    assert reject(b"", PeerRecord) == "not JSON (Expecting value at line 1 column 1)"


def test_invalid_utf8() -> None:
    assert reject(b'{"kind": "peer\xff"}', PeerRecord) == "not UTF-8 (invalid start byte at byte 14)"


def test_deeply_nested_json() -> None:
    assert reject(b"[" * 60_000, RewardRecord) == "not JSON (nested too deeply)"


@pytest.mark.parametrize(
    ("data", "name"), [(b"[1, 2]", "list"), (b'"peer"', "str"), (b"null", "NoneType"), (b"3", "int")]
)
def test_not_an_object(data: bytes, name: str) -> None:
    assert reject(data, PeerRecord) == f"expected a JSON object, got {name}"


def test_wrong_kind_peer_posing_as_state() -> None:
    assert reject(encode(peer()), StateRecord) == "kind is 'peer', expected 'state'"


def test_missing_kind() -> None:
    raw = as_dict(peer())
    del raw["kind"]
    assert reject(dumps(raw), PeerRecord) == "kind is None, expected 'peer'"


@pytest.mark.parametrize(
    ("version", "shown"), [(2, "2"), (0, "0"), ("1", "'1'"), (None, "None"), (True, "True"), (1.0, "1.0")]
)
def test_unsupported_schema_version(version: object, shown: str) -> None:
    raw = as_dict(peer()) | {"schema_version": version}
    assert reject(dumps(raw), PeerRecord) == f"schema_version {shown} is not supported (this version reads 1)"


def test_missing_schema_version() -> None:
    raw = as_dict(peer())
    del raw["schema_version"]
    assert reject(dumps(raw), PeerRecord) == "schema_version None is not supported (this version reads 1)"


def test_unknown_extra_field() -> None:
    raw = as_dict(peer()) | {"pickle": "gASV"}
    assert reject(dumps(raw), PeerRecord) == "schema: pickle: Extra inputs are not permitted (1 error(s))"


def test_unknown_field_inside_a_group() -> None:
    raw = as_dict(RECORDS["rollouts"]())
    raw["groups"][1]["extra"] = 1
    assert reject(dumps(raw), RolloutBatch) == "schema: groups.1.extra: Extra inputs are not permitted (1 error(s))"


@pytest.mark.parametrize("token", [b"NaN", b"Infinity", b"-Infinity"])
def test_nan_and_infinity_rejected(token: bytes) -> None:
    data = encode(reward()).replace(b'"reward":0.625', b'"reward":' + token)
    assert token in data
    assert reject(data, RewardRecord) == "schema: reward: Input should be a finite number (1 error(s))"


@pytest.mark.parametrize("value", ["2", 2.0, True])
def test_non_int_where_int_expected(value: object) -> None:
    raw = as_dict(reward()) | {"round": value}
    assert reject(dumps(raw), RewardRecord) == "schema: round: Input should be a valid integer (1 error(s))"


def test_missing_field() -> None:
    raw = as_dict(reward())
    del raw["run_id"]
    assert reject(dumps(raw), RewardRecord) == "schema: run_id: Field required (1 error(s))"


def test_error_count_reported() -> None:
    raw = as_dict(reward()) | {"round": "x", "stage": -1, "extra": 0}
    assert reject(dumps(raw), RewardRecord).endswith("(3 error(s))")


@pytest.mark.parametrize("node_id", ["../../x", "a/b", ".hidden", "", "a\n"])
def test_node_id_that_is_a_path(node_id: str) -> None:
    raw = as_dict(peer()) | {"node_id": node_id}
    assert (
        reject(dumps(raw), PeerRecord) == f"schema: node_id: String should match pattern '{NODE_PATTERN}' (1 error(s))"
    )


def test_bad_node_id_in_a_list() -> None:
    raw = as_dict(state()) | {"live_workers": ["w-1", "../x"]}
    message = reject(dumps(raw), StateRecord)
    assert message == f"schema: live_workers.1: String should match pattern '{NODE_PATTERN}' (1 error(s))"


@pytest.mark.parametrize(("field", "value"), [("round", -1), ("heartbeat", -1), ("registered_at", -0.5)])
def test_negative_values_rejected(field: str, value: int) -> None:
    raw = as_dict(peer()) | {field: value}
    assert reject(dumps(raw), PeerRecord).startswith(f"schema: {field}: Input should be greater than or equal to 0")


@pytest.mark.parametrize("kind", sorted(MAX_BYTES))
def test_oversized_file(kind: str) -> None:
    model = type(RECORDS[kind]())
    cap = MAX_BYTES[kind]
    data = encode(RECORDS[kind]())
    padded = data[:-1] + b" " * (cap + 1 - len(data)) + b"}"
    assert len(padded) == cap + 1
    assert reject(padded, model) == f"{cap + 1} bytes exceeds the {cap}-byte cap for a {kind} file"


def test_file_at_the_cap_is_read() -> None:
    data = encode(peer())
    cap = MAX_BYTES["peer"]
    padded = data[:-1] + b" " * (cap - len(data)) + b"}"
    assert len(padded) == cap
    assert decode(padded, PeerRecord) == peer()


def test_too_many_completions_in_a_group() -> None:
    raw = as_dict(RECORDS["rollouts"]())
    n = MAX_COMPLETIONS_PER_GROUP + 1
    raw["groups"][0]["completions"] = ["x"] * n
    raw["groups"][0]["rewards"] = [0.0] * n
    message = reject(dumps(raw), RolloutBatch)
    assert message.startswith(f"schema: groups.0.completions: List should have at most {MAX_COMPLETIONS_PER_GROUP}")
    assert f"not {n}" in message


def test_empty_group_rejected() -> None:
    raw = as_dict(RECORDS["rollouts"]())
    raw["groups"][0]["completions"] = []
    raw["groups"][0]["rewards"] = []
    assert reject(dumps(raw), RolloutBatch).startswith("schema: groups.0.completions: List should have at least 1 item")


def test_rewards_completions_length_mismatch() -> None:
    raw = as_dict(RECORDS["rollouts"]())
    raw["groups"][1]["rewards"] = raw["groups"][1]["rewards"][:-1]
    assert reject(dumps(raw), RolloutBatch) == (
        "schema: groups.1: Value error, rewards and completions differ in length (1 error(s))"
    )


def test_length_mismatch_rejected_on_construction() -> None:
    with pytest.raises(ValueError, match="rewards and completions differ in length"):
        RolloutGroup(
            group_id="g",
            task="t",
            question="q",
            provenance=Provenance(dataset="d", seed=0, index=0),
            completions=["a", "b"],
            rewards=[1.0],
        )


def test_records_are_frozen() -> None:
    record = peer()
    with pytest.raises(ValueError, match="frozen"):
        record.heartbeat = 5  # type: ignore[misc]
    assert record.heartbeat == 4


# -- state ordering --------------------------------------------------------------------------


def test_state_is_newer_than() -> None:
    base = state(round_=2, seq=5)
    assert base.is_newer_than(None)
    assert state(round_=3, seq=0).is_newer_than(base)
    assert state(round_=2, seq=6).is_newer_than(base)
    assert not state(round_=2, seq=5).is_newer_than(base)
    assert not state(round_=2, seq=4).is_newer_than(base)
    assert not state(round_=1, seq=99).is_newer_than(base)
    # Status plays no part: the coordinator increments seq on every write, finishing included, so an
    # extended run's running state (same round, higher seq) wins over the finished one it follows.
    finished = state(round_=2, seq=6, status="finished")
    assert finished.is_newer_than(base)
    assert state(round_=2, seq=7).is_newer_than(finished)
    assert not state(round_=2, seq=0, status="finished").is_newer_than(base)


def test_state_order_is_a_total_order() -> None:
    states = [state(r, s) for r in (0, 1) for s in (0, 1, 2)]
    for i, a in enumerate(states):
        for j, b in enumerate(states):
            if i == j:
                assert not a.is_newer_than(b)
            else:  # distinct (round, seq): exactly one of the two is newer
                assert a.is_newer_than(b) != b.is_newer_than(a)


# -- JSONL -----------------------------------------------------------------------------------


def test_decode_lines() -> None:
    one = MetricRecord(node_id="w", round=0, ts=1.0, values={"train/loss": 1.0})
    two = MetricRecord(node_id="w", round=1, ts=2.0, values={"train/loss": 0.5})
    data = (
        encode_line(one)
        + b"{broken\n"
        + b"\n"
        + encode_line(EventRecord(node_id="w", ts=1.0, event="e"))
        + encode_line(two)
        + encode(two)[:15]  # a writer mid-append
    )
    records, problems = decode_lines(data, MetricRecord)
    assert records == [one, two]
    assert problems == [
        "line 2: not JSON (Expecting property name enclosed in double quotes at line 1 column 2)",
        "line 4: kind is 'event', expected 'metric'",
    ]


def test_decode_lines_complete_last_line_is_kept() -> None:
    one = EventRecord(node_id="w", ts=1.0, event="a")
    records, problems = decode_lines(encode_line(one) + encode(one), EventRecord)
    assert (records, problems) == ([one], [])
    records, problems = decode_lines(encode_line(one) * 3, EventRecord)
    assert (records, problems) == ([one, one, one], [])


def test_decode_lines_empty() -> None:
    assert decode_lines(b"", EventRecord) == ([], [])
    assert decode_lines(b"\n\n", EventRecord) == ([], [])
