"""A property-based fuzzer of everything that reads the shared folder (issue 14).

Random bytes and adversarial JSON (integers of thousands of digits, deep nesting, wrong types, NaN and
Infinity, duplicate keys, lone surrogates and other unicode oddities, every record kind with mutated fields)
go to every decoder, and, planted in a small experiment folder together with type confusion (a folder where a
file belongs, a file or FIFO where a folder belongs), to every reader: the exchange's reads, the monitor's
load, findings, status table and validator, ``compare`` and the report. The property: a decoder returns a
record or raises ``RecordError``; a reader never raises, and a file that does not decode is rejected with its
path in the rejections (the exchange's hook, the monitor's problems).

Bounded for CI: the whole module runs in well under a minute.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarm_gdrive.observe import monitor
from swarm_gdrive.observe.analysis import compare
from swarm_gdrive.protocol.exchange import Exchange
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import (
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
    encode_line,
)
from swarm_gdrive.storage import LocalStorage

EXPERIMENT = "fz"
LAYOUT = Layout(EXPERIMENT)
RUN = "0123456789abcdef"
HUGE = "\x00huge-int\x00"  # stands for an integer literal longer than Python's int conversion limit
HUGE_DIGITS = "9" * 5000
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FOLDER = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def samples() -> dict[type, object]:
    """One valid record of every kind."""
    group = RolloutGroup(
        group_id="r0-s0-g0",
        task="synthetic_sum",
        question="What is 1 + 2?",
        provenance=Provenance(dataset="synthetic_sum", seed=1, index=0),
        completions=["3", "4"],
        rewards=[1.0, 0.0],
        stop_reasons=["eos", "length"],
        tokenizer="0123456789abcdef",
        token_ids=[[18], None],
    )
    return {
        ExperimentRecord: ExperimentRecord(
            experiment=EXPERIMENT,
            run_id=RUN,
            fingerprint="0" * 16,
            config={"num_transplant_trees": 1, "max_rounds": 3},
            coordinator_id="coord",
            created_at=1.0,
        ),
        StateRecord: StateRecord(
            experiment=EXPERIMENT,
            run_id=RUN,
            round=2,
            status="running",
            seq=5,
            max_rounds=3,
            num_stages=1,
            round_opened_at=1.0,
            round_deadline=61.0,
            live_workers=["w1", "w2"],
            coordinator_id="coord",
            updated_at=1.0,
        ),
        PeerRecord: PeerRecord(
            node_id="w1",
            role="worker",
            run_id=RUN,
            registered_at=1.0,
            heartbeat=3,
            heartbeat_at=2.0,
            status="alive",
            round=2,
        ),
        RewardRecord: RewardRecord(
            node_id="w1",
            run_id=RUN,
            round=0,
            stage=0,
            reward=0.5,
            num_local_groups=1,
            num_external_groups=1,
            external_requested=1,
            submitted_at=1.0,
        ),
        RolloutBatch: RolloutBatch(node_id="w1", run_id=RUN, round=0, stage=0, groups=[group], created_at=1.0),
        MetricRecord: MetricRecord(node_id="w1", round=0, ts=1.0, values={"train/loss": 0.5, "stage": 0}),
        EventRecord: EventRecord(node_id="w1", round=0, ts=1.0, event="worker_started", data={"run_id": RUN}),
        EvalRecord: EvalRecord(
            node_id="w1",
            run_id=RUN,
            round=0,
            results=[TaskEval(task="synthetic_sum", n=4, pass1=0.5, mean_score=0.5)],
            created_at=1.0,
        ),
    }


MODELS = list(samples())

# -- adversarial JSON ------------------------------------------------------------------------------------------

ODD_TEXT = st.sampled_from(
    ["", "\x00", "\ud800", "\udfff", "\u202e", "\x1b[2J", "../../x", "W1", "ｗ1", "a" * 200, "é" * 70, "\n"]
)
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    ODD_TEXT,
    st.just(HUGE),
)
JSON_VALUES = st.recursive(
    LEAVES,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def dumps(value: object) -> str:
    """JSON text with NaN/Infinity tokens allowed and every ``HUGE`` turned into a 5,000-digit integer."""
    return json.dumps(value, allow_nan=True).replace(json.dumps(HUGE), HUGE_DIGITS)


def _paths(value: object, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside nested dicts and lists."""
    out = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            out += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            out += _paths(child, (*prefix, i))
    return out


def _set(value: object, path: tuple, new: object) -> object:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)  # type: ignore[arg-type]
    copy[path[0]] = new if len(path) == 1 else _set(copy[path[0]], path[1:], new)  # type: ignore[index]
    return copy


def _delete(value: object, path: tuple) -> object:
    if len(path) == 1:
        copy = dict(value) if isinstance(value, dict) else list(value)  # type: ignore[arg-type]
        del copy[path[0]]  # type: ignore[arg-type]
        return copy
    return _set(value, path[:1], _delete(value[path[0]], path[1:]))  # type: ignore[index]


@st.composite
def mutated(draw, model: type | None = None) -> tuple[type, bytes]:
    """A record of some kind with one to three adversarial changes, as the bytes a hostile writer would plant."""
    model = model or draw(st.sampled_from(MODELS))
    value: object = json.loads(encode(samples()[model]))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(value)
        how = draw(st.sampled_from(["set", "set", "delete", "extra"]))
        path = draw(st.sampled_from(paths))
        if how == "set":
            value = _set(value, path, draw(JSON_VALUES))
        elif how == "delete" and path:
            value = _delete(value, path)
        elif isinstance(value, dict):
            value = {**value, draw(st.text(max_size=8)): draw(JSON_VALUES)}
    text = dumps(value)
    if draw(st.booleans()) and text.startswith("{") and len(text) > 2:  # a duplicate key, first or last wins?
        text = "{" + draw(st.sampled_from(['"kind":"state",', '"node_id":"w2",', '"round":7,'])) + text[1:]
    return model, text.encode("utf-8", "surrogatepass")


def nested(depth: int, kind: str) -> bytes:
    """A record whose first field nests ``depth`` lists deep."""
    return (f'{{"schema_version":1,"kind":"{kind}","x":' + "[" * depth + "]" * depth + "}").encode()


def check_decode(data: bytes, model: type) -> None:
    try:
        record = decode(data, model)
    except RecordError as exc:
        assert str(exc), "a rejection always says why"
        return
    assert isinstance(record, model)
    assert decode(encode(record), model) == record  # what is accepted survives a round trip


# -- decoders --------------------------------------------------------------------------------------------------


@FAST
@given(st.sampled_from(MODELS), st.binary(max_size=2048))
def test_random_bytes_decode_or_are_rejected(model, data):
    check_decode(data, model)


@FAST
@given(mutated())
def test_mutated_records_of_every_kind_decode_or_are_rejected(case):
    model, data = case
    check_decode(data, model)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(MODELS), st.integers(1, 20_000))
def test_deep_nesting_within_the_caps_is_rejected(model, depth):
    with pytest.raises(RecordError):
        decode(nested(depth, model.model_fields["kind"].default), model)


@pytest.mark.parametrize("model", MODELS)
def test_an_integer_beyond_the_conversion_limit_is_a_rejection_in_every_kind(model):
    kind = model.model_fields["kind"].default
    data = f'{{"schema_version":1,"kind":"{kind}","round":{HUGE_DIGITS}}}'.encode()
    assert 5000 < len(data) < 5200  # the 5 KB file of the issue
    with pytest.raises(RecordError, match="an integer of more than 4300 digits"):
        decode(data, model)


@pytest.mark.parametrize("model", [PeerRecord, RewardRecord, StateRecord])
def test_counts_beyond_64_bits_are_rejected(model):
    value = json.loads(encode(samples()[model]))
    field = {PeerRecord: "heartbeat", RewardRecord: "num_local_groups", StateRecord: "seq"}[model]
    with pytest.raises(RecordError, match=f"schema: {field}: "):
        decode(json.dumps({**value, field: 2**64}).encode(), model)


@pytest.mark.parametrize("value", [2**64, 10**400, -1, 2**31])
def test_a_token_id_beyond_its_range_is_rejected(value):
    raw = json.loads(encode(samples()[RolloutBatch]))
    raw["groups"][0]["token_ids"][0] = [value]
    with pytest.raises(RecordError, match="schema: groups.0.token_ids.0.0: "):
        decode(json.dumps(raw).encode(), RolloutBatch)


@pytest.mark.parametrize(
    "model, path",
    [(MetricRecord, ("values", "stage")), (ExperimentRecord, ("config", "max_rounds")), (EventRecord, ("data", "n"))],
)
def test_a_free_number_beyond_64_bits_is_a_float_never_a_huge_int(model, path):
    value = json.loads(encode(samples()[model]))
    record = decode(json.dumps(_set(value, path, 2**64)).encode(), model)
    got = getattr(record, path[0])[path[1]]
    assert type(got) is float and got == 2.0**64
    with pytest.raises(RecordError, match="schema: "):  # 10**400 is no float either
        decode(json.dumps(_set(value, path, 10**400)).encode(), model)


@FAST
@given(
    st.lists(
        st.one_of(st.binary(max_size=80), mutated(MetricRecord).map(lambda c: c[1]), st.just(b"")),
        max_size=8,
    ),
    st.booleans(),
)
def test_jsonl_lines_decode_or_are_rejected_one_by_one(lines, torn):
    good = encode_line(samples()[MetricRecord])
    data = b"\n".join(line.replace(b"\n", b" ") for line in lines) + b"\n" + good + (b'{"sche' if torn else b"")
    records, problems = decode_lines(data, MetricRecord)
    assert records and records[-1] == samples()[MetricRecord]  # the good line survives whatever precedes it
    assert all(p.startswith("line ") for p in problems)
    capped, few = decode_lines(data, MetricRecord, max_problems=1)
    assert capped == records and len(few) <= 2


# -- readers of a folder ---------------------------------------------------------------------------------------

FILES = {
    LAYOUT.experiment_file: ExperimentRecord,
    LAYOUT.state_file: StateRecord,
    LAYOUT.peer_file("w1"): PeerRecord,
    LAYOUT.reward_file(0, 0, "w1"): RewardRecord,
    LAYOUT.rollout_file(0, 0, "w1"): RolloutBatch,
    LAYOUT.eval_file(0, "w1"): EvalRecord,
}
LOGS = {LAYOUT.metrics_file("w1"): MetricRecord, LAYOUT.events_file("w1"): EventRecord}
FOLDERS = [
    LAYOUT.state_dir,
    LAYOUT.peers_dir,
    f"{LAYOUT.rewards_dir}/round_1",
    f"{LAYOUT.rewards_dir}/round_1/stage_0",
    LAYOUT.rollouts_round_dir(1),
    LAYOUT.rollouts_stage_dir(1, 0),
    f"{LAYOUT.evals_dir}/round_0",
    LAYOUT.logs_dir("w2"),
]


def build_folder(root: Path) -> None:
    """A small, valid experiment: 2 workers, rounds 0 and 1 played, round 2 open."""
    storage = LocalStorage(root)
    records = samples()
    storage.write_bytes(LAYOUT.experiment_file, encode(records[ExperimentRecord]))
    storage.write_bytes(LAYOUT.state_file, encode(records[StateRecord]))
    for node in ("w1", "w2"):
        peer = records[PeerRecord].model_copy(update={"node_id": node})
        storage.write_bytes(LAYOUT.peer_file(node), encode(peer))
        for round_ in (0, 1):
            reward = records[RewardRecord].model_copy(update={"node_id": node, "round": round_, "reward": 0.1 * round_})
            storage.write_bytes(LAYOUT.reward_file(round_, 0, node), encode(reward))
            batch = records[RolloutBatch].model_copy(update={"node_id": node, "round": round_})
            storage.write_bytes(LAYOUT.rollout_file(round_, 0, node), encode(batch))
        storage.write_bytes(LAYOUT.eval_file(0, node), encode(records[EvalRecord].model_copy(update={"node_id": node})))
        for model in (MetricRecord, EventRecord):
            line = encode_line(records[model].model_copy(update={"node_id": node}))
            path = LAYOUT.metrics_file(node) if model is MetricRecord else LAYOUT.events_file(node)
            storage.append_bytes(path, line * 3)


@st.composite
def plantings(draw) -> list[tuple[str, str, bytes]]:
    """One to three hostile things to plant: ``(how, path, bytes)`` with how in bytes, folder, file, fifo."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["bytes", "bytes", "bytes", "folder", "file", "fifo"]))
        if how == "bytes":
            path = draw(st.sampled_from(sorted(FILES) + sorted(LOGS)))
            model = FILES.get(path) or LOGS[path]
            data = draw(
                st.one_of(
                    st.binary(max_size=300),
                    mutated(model).map(lambda c: c[1]),
                    st.just(nested(5000, "x")),
                    st.just(b'{"schema_version":1,"kind":"x","round":' + HUGE_DIGITS.encode() + b"}"),
                )
            )
            if path in LOGS:
                data = data.replace(b"\n", b" ") + b"\n"
            out.append((how, path, data))
        elif how in ("folder", "fifo"):
            out.append((how, draw(st.sampled_from(sorted(FILES) + sorted(LOGS))), b""))
        else:
            out.append((how, draw(st.sampled_from(FOLDERS)), b"x"))
    return out


def plant(root: Path, how: str, rel: str, data: bytes) -> bool:
    """Put ``how`` at ``rel`` in place of what is there; False when an earlier planting blocks its path."""
    target = root / rel
    try:
        if target.is_dir():
            for sub in sorted(target.rglob("*"), reverse=True):
                sub.rmdir() if sub.is_dir() else sub.unlink()
            target.rmdir()
        elif target.exists():
            target.unlink()
        target.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):  # a file planted where one of its folders belongs
        return False
    if how == "folder":
        target.mkdir()
    elif how == "fifo":
        os.mkfifo(target)
    else:
        target.write_bytes(data)
    return True


def read_everything(root: Path) -> tuple[dict[str, str], monitor.Snapshot]:
    """Every read of the folder a node or a command makes; returns the exchange's rejections and the snapshot."""
    storage = LocalStorage(root, retry_attempts=2, retry_max_wait=0.01)
    rejected: dict[str, str] = {}
    exchange = Exchange(storage, LAYOUT, "w2", run_id=RUN, on_reject=rejected.__setitem__)
    exchange.read_experiment()
    try:
        exchange.read_state()
    except Exception as exc:  # noqa: BLE001 - only a state of another run may raise, and says so
        assert type(exc).__name__ == "RunChangedError", exc
    exchange.read_peers()
    exchange.registered_workers()
    exchange.read_rewards(0, 0)
    exchange.read_rewards(1, 0, only={"w1"})
    exchange.read_rollouts(0, 0)
    exchange.read_evals()
    exchange.own_rollout_rounds()
    exchange.cleanup_rollouts(current_round=2, keep_last=1, archive=False)
    exchange.remove_empty_rollout_dirs(2)

    snapshot = monitor.load(LocalStorage(root), EXPERIMENT)
    found = monitor.findings(snapshot)
    assert found and found[0].severity in ("error", "warning", "info")
    monitor.status_table(snapshot)
    monitor.checks(snapshot, rounds=2, nodes=2, transplants=1)
    compare(LocalStorage(root), [EXPERIMENT], EXPERIMENT)
    return rejected, snapshot


def assert_rejected(plantings: list[tuple[str, str, bytes]], rejected: dict[str, str], snapshot) -> None:
    """A planted file that does not decode is among the monitor's problems (the last planting at a path wins)."""
    final = {path: (how, data) for how, path, data in plantings}
    for path, (how, data) in final.items():
        if how != "bytes" or any(path.startswith(other + "/") for h, other, _ in plantings if h in ("file", "fifo")):
            continue
        model = FILES.get(path) or LOGS.get(path)
        bad = decode_lines(data, model)[1] if path in LOGS else _undecodable(data, model)
        if bad:
            assert any(p.startswith(f"{path}: ") for p in snapshot.problems), (path, data[:80], snapshot.problems)


def _undecodable(data: bytes, model: type) -> bool:
    try:
        decode(data, model)
    except RecordError:
        return True
    return False


@FOLDER
@given(plantings())
def test_every_reader_of_the_folder_survives_hostile_files_and_type_confusion(planted):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_folder(root)
        planted = [(how, rel, data) for how, rel, data in planted if plant(root, how, rel, data)]
        rejected, snapshot = read_everything(root)
        assert_rejected(planted, rejected, snapshot)
        final = {rel: how for how, rel, _ in planted}
        for rel, how in final.items():
            replaced = any(rel.startswith(other + "/") for h, other, _ in planted if h in ("file", "fifo"))
            if how == "folder" and rel in FILES and not replaced:  # a folder where a file belongs is named as such
                assert any(p.startswith(f"{rel}: a folder") for p in snapshot.problems), (rel, snapshot.problems)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plantings())
def test_the_report_is_written_whatever_the_folder_holds(planted):
    from swarm_gdrive.observe.report import write_report

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "drive"
        build_folder(root)
        for how, rel, data in planted:
            plant(root, how, rel, data)
        files = write_report(LocalStorage(root), EXPERIMENT, Path(tmp) / "report")
        page = (Path(tmp) / "report" / "index.html").read_text(encoding="utf-8")
        assert files and "<h2>Findings</h2>" in page and "\x1b" not in page


# -- names that are not UTF-8 (issue 30, class 5) ----------------------------------------------------------------

#: Byte sequences no UTF-8 decoder accepts: lone bytes, a truncated sequence, an encoded surrogate, an overlong '/'.
NOT_UTF8 = [b"\xff", b"\xfe\xff", b"\x80", b"\xc3(", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf8\x88\x80\x80\x80"]
ALL_FOLDERS = ["experiments", LAYOUT.root, *FOLDERS]


@st.composite
def bad_names(draw) -> bytes:
    """A file or folder name (no '/', no NUL) whose bytes are not UTF-8, around one of :data:`NOT_UTF8`."""
    around = st.binary(max_size=8).map(lambda b: b.replace(b"/", b"_").replace(b"\x00", b"_"))
    return draw(around) + draw(st.sampled_from(NOT_UTF8)) + draw(around)


@st.composite
def bad_plantings(draw) -> list[tuple[str, bytes, bytes | str | None]]:
    """One to four ``(folder, name, what)`` named with bytes that are not UTF-8: a folder (None), a file of random
    bytes, or a copy of a valid record of the folder (its path, a ``str``)."""
    what = st.one_of(st.none(), st.binary(max_size=200), st.sampled_from(sorted(FILES)))
    return [(draw(st.sampled_from(ALL_FOLDERS)), draw(bad_names()), draw(what)) for _ in range(draw(st.integers(1, 4)))]


def plant_bytes_name(root: Path, folder: str, name: bytes, what: bytes | str | None) -> None:
    """Put a folder (None), a file of ``what``'s bytes, or a copy of the record at ``what`` (a ``str``), named
    ``name`` (bytes: no ``str`` path can name it) in ``folder``."""
    base = os.path.join(os.fsencode(root), os.fsencode(folder))
    os.makedirs(base, exist_ok=True)
    path = os.path.join(base, name)
    if os.path.lexists(path):
        return
    if what is None:
        os.mkdir(path)
        return
    with open(path, "wb") as fh:
        fh.write((root / what).read_bytes() if isinstance(what, str) else what)


def _printable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@FOLDER
@given(bad_plantings())
def test_names_that_are_not_utf8_are_left_out_of_every_listing_and_no_reader_raises(planted):
    """Every backend's listing leaves the names out (never raises, never gives a surrogate-escaped name), and every
    reader of the folder runs as without them: no rejection, problem or experiment names one of them."""
    from swarm_gdrive.storage.fsspec_storage import FsspecStorage

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_folder(root)
        clean = {
            folder: sorted(os.listdir(root / folder)) if (root / folder).is_dir() else [] for folder in ALL_FOLDERS
        }
        for folder, name, data in planted:
            plant_bytes_name(root, folder, name, data)
        for storage in (LocalStorage(root), FsspecStorage(f"file://{root}")):
            for folder in ALL_FOLDERS:
                names = sorted(info.name for info in storage.list(folder))
                assert all(_printable(n) for n in names), (type(storage).__name__, folder, names)
                assert names == clean[folder], (type(storage).__name__, folder, names, clean[folder])
        rejected, snapshot = read_everything(root)
        assert not rejected, rejected
        texts = [*snapshot.problems, *(str(f) for f in monitor.findings(snapshot))]
        assert all(_printable(t) for t in texts), texts
        assert monitor.list_experiments(LocalStorage(root)) == [EXPERIMENT]
