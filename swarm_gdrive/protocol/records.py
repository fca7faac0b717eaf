"""Typed, versioned records for every file of the protocol, validated on the way in.

Every file carries ``kind`` and ``schema_version``. :func:`decode` accepts bytes from the
shared folder only if they are within the kind's size cap, valid UTF-8 JSON, and match
the schema exactly (unknown fields, NaN, wrong types, integers beyond 64 bits and oversized
lists are rejected). Whatever the parser raises on hostile bytes becomes a :class:`RecordError`
with a reason: a reader never crashes on a file. Nothing read from the folder is ever executed
or unpickled.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    ValidationError,
    model_serializer,
    model_validator,
)

SCHEMA_VERSION = 1

NodeId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
RunId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{8,64}$")]
ShortText = Annotated[str, StringConstraints(max_length=128)]
Round = Annotated[int, Field(ge=0, le=10**9)]
Stage = Annotated[int, Field(ge=0, le=1000)]
Timestamp = Annotated[float, Field(ge=0)]
#: Every integer a file may hold fits 64 bits: a 4,000-digit number is valid JSON, and poison for pandas and float().
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
Count = Annotated[int, Field(ge=0, le=2**63 - 1)]
Scalar = bool | Int64 | float | str | None

#: An Ed25519 public key and a signature, hex (protocol/signing.py).
PublicKey = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Signature = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{128}$")]

#: Limits on what a peer may put in a rollout file.
MAX_GROUPS_PER_BATCH = 512
MAX_COMPLETIONS_PER_GROUP = 64
MAX_COMPLETION_CHARS = 16_384
MAX_QUESTION_CHARS = 16_384
#: The most token ids one completion may carry: the upper bound of MAX_NEW_TOKENS (config).
MAX_COMPLETION_TOKENS = 4096

#: A sampled token id; real vocabularies are far smaller, and the receiver checks it against its own.
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
#: ``tokenizer_fingerprint()``: 16 hex chars of a sha256 over the writer's tokenizer.
TokenizerFingerprint = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")]
#: Why a completion ended: the model sampled an eos token, or it reached the cap of new tokens.
StopReason = Literal["eos", "length"]

#: Size caps per kind, checked before a file is parsed.
MAX_BYTES = {
    "experiment": 64 * 1024,
    "state": 1024 * 1024,
    "peer": 16 * 1024,
    "reward": 64 * 1024,
    "rollouts": 32 * 1024 * 1024,
    "metric": 64 * 1024,
    "event": 64 * 1024,
    "eval": 256 * 1024,
}


class RecordError(ValueError):
    """Bytes that are not a valid record of the expected kind; the message says why."""


@dataclass(frozen=True)
class OmitWhen:
    """A field's marker: the field is left out of the JSON when ``test(value)``, so that a file without a newer
    field reads as it did before the field existed. pydantic 2.12's ``Field(exclude_if=...)`` does this, but 2.11
    (Colab's) ignores it: a node there wrote ``"mode":"sync"`` and signed other bytes than the coordinator did."""

    test: Callable[[Any], bool]


OMIT_NONE = OmitWhen(lambda value: value is None)
OMIT_SYNC = OmitWhen(lambda value: value == "sync")


@functools.cache
def _omitted(model: type[BaseModel]) -> tuple[tuple[str, Callable[[Any], bool]], ...]:
    return tuple(
        (name, marker.test)
        for name, field in model.model_fields.items()
        for marker in field.metadata
        if isinstance(marker, OmitWhen)
    )


class _Omitting(BaseModel):
    """Serialises without the fields whose :class:`OmitWhen` test holds, on every pydantic 2 release."""

    @model_serializer(mode="wrap")
    def _omit(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        for name, test in _omitted(type(self)):
            if name in data and test(getattr(self, name)):
                del data[name]
        return data


class _Record(_Omitting):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    schema_version: Literal[1] = SCHEMA_VERSION


class ExperimentRecord(_Record):
    """experiment.json: written by the coordinator when it creates the experiment (again, unchanged, when it resumes
    a signed one)."""

    kind: Literal["experiment"] = "experiment"
    experiment: NodeId
    run_id: RunId
    fingerprint: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")]
    config: dict[ShortText, Scalar] = Field(max_length=64)
    coordinator_id: NodeId
    created_at: Timestamp
    #: ROUND_MODE of the run, fixed at its creation: a state of another mode is not this run's (a worker never
    #: plays it, a restarting coordinator recovers from it). Left out of the JSON when ``sync``, as before the field.
    mode: Annotated[Literal["sync", "async"], OMIT_SYNC] = "sync"
    #: The coordinator's Ed25519 public key (protocol/signing.py), which signs this file and every state of the run.
    #: None (left out of the JSON) in experiments created before it existed: their states are trusted as before.
    public_key: Annotated[PublicKey | None, OMIT_NONE] = None
    signature: Annotated[Signature | None, OMIT_NONE] = None


class StateRecord(_Record):
    """state/current_state.json: the round clock, written only by the coordinator."""

    kind: Literal["state"] = "state"
    experiment: NodeId
    run_id: RunId
    round: Round
    #: ``stopped``: the coordinator was stopped (its stop button, SIGTERM, Ctrl-C) before the experiment finished;
    #: a restarted coordinator resumes the round. Workers that were following the rounds checkpoint and exit.
    status: Literal["waiting", "running", "finished", "stopped"]
    seq: Count
    max_rounds: Annotated[int, Field(ge=1, le=2**63 - 1)]
    num_stages: Annotated[int, Field(ge=1, le=1000)]
    round_opened_at: Timestamp
    round_deadline: Timestamp
    live_workers: list[NodeId] = Field(default_factory=list, max_length=10_000)
    advance_reason: Literal["start", "resume", "all_submitted", "interval", "finished", "deadline"] = "start"
    coordinator_id: NodeId
    updated_at: Timestamp
    #: ``sync``: the rounds above are the swarm's clock. ``async`` (ROUND_MODE=async): each worker plays its own
    #: rounds and ``round`` is no clock (0 while running, ``max_rounds`` once finished, unchanged by a deadline).
    #: Left out of the JSON when ``sync``, so that a synchronous run's state file is what it was before the field
    #: existed.
    mode: Annotated[Literal["sync", "async"], OMIT_SYNC] = "sync"
    #: The coordinator process that wrote the state (random, new at each start): a coordinator tells its own writes
    #: from another's, even one with its NODE_ID. Left out of the JSON when unset, as before the field existed.
    instance: Annotated[Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{8,64}$")] | None, OMIT_NONE] = None
    #: Ed25519 by experiment.json's ``public_key`` over the other fields (protocol/signing.py); None when unsigned.
    signature: Annotated[Signature | None, OMIT_NONE] = None

    def is_newer_than(self, other: StateRecord | None) -> bool:
        """Monotonic order by (round, seq): the coordinator increments seq on every write."""
        if other is None:
            return True
        return (self.round, self.seq) > (other.round, other.seq)


class PeerRecord(_Record):
    """peers/{node_id}.json: registration and heartbeat, written by that node."""

    kind: Literal["peer"] = "peer"
    node_id: NodeId
    role: Literal["coordinator", "worker"]
    run_id: RunId
    registered_at: Timestamp
    heartbeat: Count
    heartbeat_at: Timestamp
    status: Literal["alive", "stopped"]
    round: Round | None = None


class RewardRecord(_Record):
    """rewards/round_R/stage_S/{node_id}.json: a worker's submission for a stage."""

    kind: Literal["reward"] = "reward"
    node_id: NodeId
    run_id: RunId
    round: Round
    stage: Stage
    reward: float
    num_local_groups: Count
    num_external_groups: Count
    external_requested: Count
    submitted_at: Timestamp


class Provenance(BaseModel):
    """What produced a question, so that a receiver can regenerate and check it."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    dataset: ShortText
    config: dict[ShortText, Scalar | list[Scalar]] = Field(default_factory=dict, max_length=64)
    seed: Annotated[int, Field(ge=0, le=2**63)]
    index: Annotated[int, Field(ge=0, le=2**31)]


class RolloutGroup(_Omitting):
    """G completions of one question. ``rewards`` are the writer's claim: never used for scoring.

    ``stop_reasons``, ``tokenizer`` and ``token_ids`` are optional (records of older versions lack them):
    one stop reason per completion; the sampled ids of each completion (eos left out, None where the writer
    did not send them), meaningful only to a reader whose tokenizer has the same fingerprint.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    group_id: NodeId
    task: ShortText
    question: Annotated[str, StringConstraints(max_length=MAX_QUESTION_CHARS)]
    provenance: Provenance
    completions: list[Annotated[str, StringConstraints(max_length=MAX_COMPLETION_CHARS)]] = Field(
        min_length=1, max_length=MAX_COMPLETIONS_PER_GROUP
    )
    rewards: list[float] = Field(max_length=MAX_COMPLETIONS_PER_GROUP)
    # Left out of the JSON when absent, so that a group without them reads as it did in older versions.
    stop_reasons: Annotated[list[StopReason] | None, OMIT_NONE] = Field(
        default=None, max_length=MAX_COMPLETIONS_PER_GROUP
    )
    tokenizer: Annotated[TokenizerFingerprint | None, OMIT_NONE] = None
    token_ids: Annotated[
        list[Annotated[list[TokenId], Field(max_length=MAX_COMPLETION_TOKENS)] | None] | None, OMIT_NONE
    ] = Field(default=None, max_length=MAX_COMPLETIONS_PER_GROUP)

    @model_validator(mode="after")
    def _same_length(self) -> RolloutGroup:
        n = len(self.completions)
        if len(self.rewards) != n:
            raise ValueError("rewards and completions differ in length")
        if self.stop_reasons is not None and len(self.stop_reasons) != n:
            raise ValueError("stop_reasons and completions differ in length")
        if self.token_ids is not None:
            if len(self.token_ids) != n:
                raise ValueError("token_ids and completions differ in length")
            if self.tokenizer is None:
                raise ValueError("token_ids without the tokenizer fingerprint they belong to")
        return self


class RolloutBatch(_Record):
    """rollouts/round_R/stage_S/{node_id}.json: a node's shared rollouts of a stage."""

    kind: Literal["rollouts"] = "rollouts"
    node_id: NodeId
    run_id: RunId
    round: Round
    stage: Stage
    groups: list[RolloutGroup] = Field(max_length=MAX_GROUPS_PER_BATCH)
    complete: bool = True
    created_at: Timestamp


class MetricRecord(_Record):
    """One line of logs/{node_id}/metrics.jsonl; keys are namespaced (``train/…``, ``swarm/…``)."""

    kind: Literal["metric"] = "metric"
    node_id: NodeId
    round: Round | None = None
    ts: Timestamp
    values: dict[ShortText, float | Int64 | None] = Field(max_length=256)


class EventRecord(_Record):
    """One line of logs/{node_id}/training_events.jsonl."""

    kind: Literal["event"] = "event"
    node_id: NodeId
    round: Round | None = None
    ts: Timestamp
    event: ShortText
    level: Literal["debug", "info", "warning", "error"] = "info"
    message: Annotated[str, StringConstraints(max_length=2048)] = ""
    data: dict[ShortText, Scalar | list[Scalar]] = Field(default_factory=dict, max_length=64)


def standard_error(values: Sequence[float]) -> float:
    """Standard error of the mean of ``values``: sqrt(pvariance / n).

    For 0/1 values (pass@1) this is the binomial sqrt(p (1 - p) / n); 0.0 for one value or none.
    """
    n = len(values)
    if n < 2:
        return 0.0
    mean = math.fsum(values) / n
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / n / n)


class TaskEval(BaseModel):
    """One task's held-out result: greedy pass@1 (fraction of questions answered fully right).

    Each ``*_se`` is the standard error of its mean over the ``n`` questions (:func:`standard_error`);
    files written before they existed decode with None.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    task: ShortText
    level: Annotated[int, Field(ge=0, le=1000)] = 0
    n: Annotated[int, Field(ge=1, le=100_000)]
    pass1: Annotated[float, Field(ge=0, le=1)]
    mean_score: Annotated[float, Field(ge=0, le=1)]
    k: Annotated[int, Field(ge=0, le=1024)] = 0
    pass_k: Annotated[float, Field(ge=0, le=1)] | None = None
    pass1_se: Annotated[float, Field(ge=0, le=1)] | None = None
    mean_score_se: Annotated[float, Field(ge=0, le=1)] | None = None
    pass_k_se: Annotated[float, Field(ge=0, le=1)] | None = None


class EvalRecord(_Record):
    """evals/round_R/{node_id}.json: a worker's held-out evaluation before training round R."""

    kind: Literal["eval"] = "eval"
    node_id: NodeId
    run_id: RunId
    round: Round
    results: list[TaskEval] = Field(max_length=512)
    created_at: Timestamp


R = TypeVar("R", bound=_Record)


def encode(record: _Record) -> bytes:
    """Compact UTF-8 JSON of a record."""
    return record.model_dump_json().encode("utf-8")


def encode_checked(record: _Record) -> bytes:
    """:func:`encode`, read back as every reader will (the size cap aside, which the writers keep by design): a record
    made with ``model_copy``, which does not validate, can hold a value its readers reject, as a state with an
    unknown ``advance_reason`` once did. Raises ValueError, naming the kind and the reason, instead of writing a
    file every node would reject."""
    data = encode(record)
    kind = type(record).model_fields["kind"].default
    try:
        _decode(data, type(record), kind)
    except RecordError as exc:
        raise ValueError(f"refusing to write a {kind} file its readers would reject: {exc}") from None
    return data


def encode_line(record: _Record) -> bytes:
    """One JSONL line."""
    return encode(record) + b"\n"


def decode(data: bytes, model: type[R]) -> R:
    """Parse and validate ``data`` as ``model``; :class:`RecordError` says why not, whatever went wrong."""
    kind = model.model_fields["kind"].default
    cap = MAX_BYTES[kind]
    if len(data) > cap:
        raise RecordError(f"{len(data)} bytes exceeds the {cap}-byte cap for a {kind} file")
    try:
        return _decode(data, model, kind)
    except RecordError:
        raise
    except Exception as exc:  # noqa: BLE001 - anything a parser raises on hostile bytes is a rejection, never a crash
        raise RecordError(f"undecodable ({type(exc).__name__}: {_short(str(exc))})") from None


def _decode(data: bytes, model: type[R], kind: str) -> R:
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        raw: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise RecordError("not JSON (nested too deeply)") from None
    except ValueError as exc:  # an integer literal longer than Python's int conversion limit, or the like
        if "integer string conversion" in str(exc):
            raise RecordError(f"not JSON (an integer of more than {sys.get_int_max_str_digits()} digits)") from None
        raise RecordError(f"not JSON ({_short(str(exc))})") from None
    if not isinstance(raw, dict):
        raise RecordError(f"expected a JSON object, got {type(raw).__name__}")
    if raw.get("kind") != kind:
        raise RecordError(f"kind is {_short(repr(raw.get('kind')))}, expected {kind!r}")
    version = raw.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:
        raise RecordError(
            f"schema_version {_short(repr(version))} is not supported (this version reads {SCHEMA_VERSION})"
        )
    del raw  # validated again, from the text, by the model
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "<root>"
        raise RecordError(f"schema: {_short(where)}: {_short(first['msg'])} ({exc.error_count()} error(s))") from None


def _short(text: str, limit: int = 120) -> str:
    """``text`` for a log line: printable characters only, at most ``limit`` of them.

    A reason quotes what a hostile file holds (a kind, a field name); it must not carry newlines or
    terminal escapes into logs, nor megabytes into memory.
    """
    clean = "".join(c if c.isprintable() else "?" for c in text[: limit + 1])
    return clean if len(clean) <= limit else clean[: limit - 3] + "..."


def iter_lines(data: bytes, model: type[R]) -> Iterator[tuple[int, R | None, str | None]]:
    """``(line number, record, None)`` or ``(line number, None, reason)`` for each complete, non-blank line.

    A partial last line (a writer mid-append) is skipped silently. Lines are decoded one at a time, so a
    reader that keeps only what it needs of each record holds memory linear in what it keeps.
    """
    cap = MAX_BYTES[model.model_fields["kind"].default]
    start, number, end = 0, 0, len(data)
    while start < end:
        stop = data.find(b"\n", start)
        if stop < 0:
            return
        number += 1
        length, line = stop - start, data[start:stop] if stop - start <= cap else b""
        start = stop + 1
        if length > cap:  # refused by its length, without copying it
            yield number, None, f"line {number}: {length} bytes exceeds the {cap}-byte cap for a line"
        elif line.strip():
            try:
                yield number, decode(line, model), None
            except RecordError as exc:
                yield number, None, f"line {number}: {exc}"


def decode_lines(data: bytes, model: type[R], max_problems: int | None = None) -> tuple[list[R], list[str]]:
    """Parse a JSONL file: the valid records and a reason for each line rejected.

    A partial last line (a writer mid-append) is skipped silently. With ``max_problems``, at most that many
    reasons are kept, then one line that counts the rest.
    """
    records: list[R] = []
    problems: list[str] = []
    more = 0
    for _, record, problem in iter_lines(data, model):
        if record is not None:
            records.append(record)
        elif max_problems is None or len(problems) < max_problems:
            problems.append(problem or "")
        else:
            more += 1
    if more:
        problems.append(f"{more} more line(s) rejected")
    return records, problems
