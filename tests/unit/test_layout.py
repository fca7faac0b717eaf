"""layout: every path of the shared folder, names, and folder-name parsing."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from swarm_gdrive.names import InvalidNameError, validate_name
from swarm_gdrive.protocol.layout import (
    Layout,
    node_id_from_filename,
    parse_round_dir,
    parse_stage_dir,
)
from swarm_gdrive.storage.base import is_temporary

NAME_FIX = "use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit (no '/', no '..')"


@pytest.fixture
def layout() -> Layout:
    return Layout("exp1")


def test_every_path(layout: Layout) -> None:
    root = "experiments/exp1"
    assert layout.root == root
    assert layout.archive_root == "archives/exp1"
    assert layout.experiment_file == f"{root}/experiment.json"
    assert layout.state_dir == f"{root}/state"
    assert layout.state_file == f"{root}/state/current_state.json"
    assert layout.peers_dir == f"{root}/peers"
    assert layout.peer_file("w-1") == f"{root}/peers/w-1.json"
    assert layout.rewards_dir == f"{root}/rewards"
    assert layout.rewards_stage_dir(3, 1) == f"{root}/rewards/round_3/stage_1"
    assert layout.reward_file(3, 1, "w-1") == f"{root}/rewards/round_3/stage_1/w-1.json"
    assert layout.rollouts_dir == f"{root}/rollouts"
    assert layout.rollouts_round_dir(12) == f"{root}/rollouts/round_12"
    assert layout.rollouts_stage_dir(12, 0) == f"{root}/rollouts/round_12/stage_0"
    assert layout.rollout_file(12, 0, "w-1") == f"{root}/rollouts/round_12/stage_0/w-1.json"
    assert layout.archived_rollout_file(12, 0, "w-1") == "archives/exp1/rollouts/round_12/stage_0/w-1.json"
    assert layout.reset_archive_dir("20240101T000000") == "archives/exp1/reset_20240101T000000"
    assert layout.checkpoint_dir("w-1", 4) == f"{root}/checkpoints/w-1/round_4"
    assert layout.logs_dir("w-1") == f"{root}/logs/w-1"
    assert layout.metrics_file("w-1") == f"{root}/logs/w-1/metrics.jsonl"
    assert layout.events_file("w-1") == f"{root}/logs/w-1/training_events.jsonl"


def test_round_zero_is_a_round(layout: Layout) -> None:
    assert layout.rollout_file(0, 0, "a") == "experiments/exp1/rollouts/round_0/stage_0/a.json"


def test_bad_experiment_name_rejected() -> None:
    with pytest.raises(InvalidNameError) as info:
        Layout("../x")
    assert str(info.value) == f"EXPERIMENT_NAME='../x': {NAME_FIX}"
    assert info.value.fix == NAME_FIX


@pytest.mark.parametrize("node_id", ["../../x", "a/b", ".hidden", "", "x.tmp"])
def test_bad_node_id_rejected_in_every_path(layout: Layout, node_id: str) -> None:
    builders = [
        lambda: layout.peer_file(node_id),
        lambda: layout.reward_file(0, 0, node_id),
        lambda: layout.rollout_file(0, 0, node_id),
        lambda: layout.archived_rollout_file(0, 0, node_id),
        lambda: layout.checkpoint_dir(node_id, 0),
        lambda: layout.logs_dir(node_id),
        lambda: layout.metrics_file(node_id),
        lambda: layout.events_file(node_id),
    ]
    for build in builders:
        with pytest.raises(InvalidNameError) as info:
            build()
        assert str(info.value) == f"node id={node_id!r}: {NAME_FIX}"


def test_bad_reset_stamp_rejected(layout: Layout) -> None:
    with pytest.raises(InvalidNameError, match=r"^reset stamp='\.\./x': "):
        layout.reset_archive_dir("../x")


@pytest.mark.parametrize("value", [-1, -100])
def test_negative_rounds_and_stages_rejected(layout: Layout, value: int) -> None:
    for build in (
        lambda: layout.rollouts_round_dir(value),
        lambda: layout.rollout_file(value, 0, "a"),
        lambda: layout.reward_file(value, 0, "a"),
        lambda: layout.checkpoint_dir("a", value),
        lambda: layout.archived_rollout_file(value, 0, "a"),
    ):
        with pytest.raises(ValueError) as info:
            build()
        assert str(info.value) == f"round must be an int >= 0, got {value!r}"
    for build in (lambda: layout.rollouts_stage_dir(0, value), lambda: layout.reward_file(0, value, "a")):
        with pytest.raises(ValueError) as info:
            build()
        assert str(info.value) == f"stage must be an int >= 0, got {value!r}"


@pytest.mark.parametrize("value", [1.0, "1", None])
def test_non_int_rounds_rejected(layout: Layout, value: object) -> None:
    with pytest.raises(ValueError, match=r"^round must be an int >= 0, got "):
        layout.rollouts_round_dir(value)  # type: ignore[arg-type]


def test_bool_round_rejected(layout: Layout) -> None:
    """Regression: isinstance(True, int) once let a bool build 'round_True'."""
    with pytest.raises(ValueError) as info:
        layout.rollouts_round_dir(True)
    assert str(info.value) == "round must be an int >= 0, got True"
    with pytest.raises(ValueError) as info:
        layout.rollouts_stage_dir(0, False)
    assert str(info.value) == "stage must be an int >= 0, got False"


# -- names -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["a", "0", "worker-1", "node_2.b", "x" * 64, "coordinator-abc123", "a..b", "console", "com10", "nul-1"]
)
def test_validate_name_accepts(name: str) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize(
    ("name", "fix"),
    [
        ("A", "use lowercase, e.g. 'a'"),
        ("Worker-1", "use lowercase, e.g. 'worker-1'"),
        ("w.", "do not end it with '.': Windows drops a trailing dot, which makes it 'w'"),
        ("con", "Windows reserves con, prn, aux, nul, com0-com9 and lpt0-lpt9"),
        ("nul.json", "Windows reserves"),
        ("com1", "Windows reserves"),
        ("lpt9.x.y", "Windows reserves"),
        ("aux", "e.g. 'n-aux'"),
    ],
)
def test_validate_name_refuses_names_that_are_not_portable(name: str, fix: str) -> None:
    """Names that differ only in case are one file on Drive for desktop (macOS, Windows); Windows reserves
    device names and drops a trailing dot. The message names the variable, the value and the fix."""
    with pytest.raises(InvalidNameError) as info:
        validate_name(name, what="NODE_ID")
    assert str(info.value).startswith(f"NODE_ID={name!r}: ") and fix in info.value.fix


def test_uppercase_is_allowed_only_where_asked() -> None:
    assert validate_name("20240101T000000Z", "reset stamp", lowercase=False) == "20240101T000000Z"
    with pytest.raises(InvalidNameError):
        validate_name("Con", lowercase=False)  # reserved in any case


@pytest.mark.parametrize(
    "name",
    ["", ".", "..", "../x", "/", "a/b", "a\\b", ".hidden", "-x", "_x", "x" * 65, "a b", "é", "x.tmp", "a:b", "a\x00"],
)
def test_validate_name_rejects(name: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        validate_name(name, what="NODE_ID")
    assert str(info.value) == f"NODE_ID={name!r}: {NAME_FIX}"
    assert (info.value.what, info.value.value) == ("NODE_ID", name)


@pytest.mark.parametrize("value", [None, 1, b"abc"])
def test_validate_name_rejects_non_strings(value: object) -> None:
    with pytest.raises(InvalidNameError) as info:
        validate_name(value)
    assert str(info.value) == f"name={value!r}: {NAME_FIX}"


@pytest.mark.parametrize("name", ["abc\n", "worker-1\n"])
def test_validate_name_rejects_trailing_newline(name: str) -> None:
    """Regression: a pattern ending in '$' also matches before a trailing newline."""
    with pytest.raises(InvalidNameError) as info:
        validate_name(name)
    assert str(info.value) == f"name={name!r}: {NAME_FIX}"
    assert node_id_from_filename(f"{name}.json") is None


@pytest.mark.parametrize("name", ["w.part", "w.partial"])
def test_validate_name_rejects_temporary_looking_names(name: str) -> None:
    """Regression: such a node's logs/ or checkpoints/ folder would be left out of every listing."""
    assert is_temporary(name)
    with pytest.raises(InvalidNameError) as info:
        validate_name(name, "node id")
    assert str(info.value) == f"node id={name!r}: {NAME_FIX}"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (".x.json.abc123.tmp", True),
        (".hidden", True),
        ("~lock", True),
        ("x.tmp", True),
        ("x.partial", True),
        ("x.part", True),
        ("x.json", False),
        ("round_1", False),
        ("metrics.jsonl", False),
        ("x.tmp.json", False),
    ],
)
def test_is_temporary(name: str, expected: bool) -> None:
    assert is_temporary(name) is expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [("round_0", 0), ("round_12", 12), ("round_999999999", 999999999), ("round_", None), ("round_x", None)]
    + [("round_-1", None), ("round_1000000000", None), ("stage_0", None), ("xround_1", None), ("round_1.json", None)],
)
def test_parse_round_dir(name: str, expected: int | None) -> None:
    assert parse_round_dir(name) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [("stage_0", 0), ("stage_3", 3), ("stage_9999", 9999), ("stage_10000", None), ("stage_", None)]
    + [("round_0", None), ("stage_-1", None), ("stage_a", None)],
)
def test_parse_stage_dir(name: str, expected: int | None) -> None:
    assert parse_stage_dir(name) == expected


@pytest.mark.parametrize(
    ("parse", "name"),
    [(parse_round_dir, "round_01"), (parse_round_dir, "round_\u0661"), (parse_round_dir, "round_1\n")]
    + [(parse_stage_dir, "stage_00"), (parse_stage_dir, "stage_\u0663"), (parse_stage_dir, "stage_0\n")],
)
def test_parse_dir_rejects_non_canonical(parse: Callable[[str], int | None], name: str) -> None:
    """Regression: 'round_01' or 'round_\u0661' once parsed as round 1, a folder layout never builds."""
    assert parse(name) is None


def test_parsed_dirs_round_trip(layout: Layout) -> None:
    round_name = layout.rollouts_round_dir(7).rsplit("/", 1)[-1]
    stage_name = layout.rollouts_stage_dir(7, 2).rsplit("/", 1)[-1]
    assert (parse_round_dir(round_name), parse_stage_dir(stage_name)) == (7, 2)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("worker-1.json", "worker-1"),
        ("a.b.json", "a.b"),
        ("worker-1.jsonl", None),
        ("worker-1.txt", None),
        (".json", None),
        (".worker-1.json", None),
        (".worker-1.json.abc.tmp", None),
        ("x.tmp.json", None),
        ("worker-1", None),
        ("a b.json", None),
        ("W1.json", None),
        ("con.json", None),
    ],
)
def test_node_id_from_filename(name: str, expected: str | None) -> None:
    assert node_id_from_filename(name) == expected


def test_node_id_from_filename_inverts_peer_file(layout: Layout) -> None:
    assert node_id_from_filename(layout.peer_file("w-9").rsplit("/", 1)[-1]) == "w-9"
