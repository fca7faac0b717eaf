"""TASK_SOURCE=datasets and REWARD_FUNCTIONS: a GSM8K-format dataset built here, its split, its answer checks, peers'
groups, the reward's terms, reward functions that fail, and the task's part of the experiment's fingerprint."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from swarm_gdrive.config import ConfigError, from_env
from swarm_gdrive.protocol.records import Provenance, RolloutGroup
from swarm_gdrive.training import dataset_task
from swarm_gdrive.training.dataset_task import DatasetTask, check_answer, load_rows, reference_answer
from swarm_gdrive.training.reward_terms import (
    RewardFunctionError,
    build_reward,
    load_reward_function,
    parse_reward_functions,
)
from swarm_gdrive.training.tasks import normalise_question

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))  # task_rewards: a node's own reward-function module
SEED = 42


def gsm8k_rows(n: int = 60, offset: int = 0) -> list[dict[str, str]]:
    """GSM8K's format: a question, and a worked answer whose last line is '#### n'."""
    rows = []
    for i in range(n):
        a, b = 3 + i, 7 + (i * 5) % 11 + offset
        rows.append(
            {
                "question": f"Mia has {a} marbles and finds {b} more. How many marbles does Mia have now?",
                "answer": f"Mia has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} marbles.\n#### {a + b:,}",
            }
        )
    return rows


def write_jsonl(path: Path, rows: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def task() -> DatasetTask:
    return DatasetTask(gsm8k_rows(), SEED, held_out=8)


def group_for(q, completions: list[str] | None = None, **changes) -> RolloutGroup:
    completions = completions or ["<answer>1</answer>"]
    fields = {
        "group_id": "r0-s0-g0",
        "task": q.task,
        "question": q.question,
        "provenance": q.provenance,
        "completions": completions,
        "rewards": [0.0] * len(completions),
    }
    return RolloutGroup(**{**fields, **changes})


# -- answers ---------------------------------------------------------------------------------------------------------


def test_gsm8k_reference_is_what_follows_the_hashes() -> None:
    assert reference_answer("Mia has 3 + 7 = 10 marbles.\n#### 1,010") == "1,010"
    assert reference_answer(" 42 ") == "42"


@pytest.mark.parametrize(
    ("answer", "reference", "mode", "expected"),
    [
        ("1010", "1,010", "math", 1.0),
        ("$1,010.", "1010", "numeric", 1.0),
        ("0.5", "\\frac{1}{2}", "math", 1.0),
        ("\\frac12", "1/2", "math", 1.0),
        ("x + 1", "1 + x", "math", 1.0),
        ("\\boxed{3}", "3", "math", 1.0),
        ("11", "10", "math", 0.0),
        ("1/2", "0.5", "numeric", 1.0),
        ("x", "1", "numeric", 0.0),
        ("Paris  France", "Paris France", "exact", 1.0),
        ("paris", "Paris", "exact", 0.0),
        (None, "1", "math", 0.0),
        ("", "1", "math", 0.0),
    ],
)
def test_check_answer(answer: str | None, reference: str, mode: str, expected: float) -> None:
    assert check_answer(answer, reference, mode) == expected


@pytest.mark.parametrize("hostile", ["9^9^9^9", "10^{99999}", "9**9999", "99999!", "1" * 40, "2^2^2^2^2", "x" * 300])
def test_hostile_answers_score_zero_at_once(hostile: str) -> None:
    started = time.monotonic()
    assert check_answer(hostile, "1", "math") == 0.0
    assert time.monotonic() - started < 2.0


REVIEWED_HOSTILE = [  # each ran for minutes (or out of memory) in math-verify before the whitelist screen
    r"9^{9^{9}}",
    r"10^{10^{10}}",
    r"10^{-10^{10}}",
    r"\sqrt{10^{10^{10}}}",
    r"\lfloor 10^{10^{9}} \rfloor",
    r"\prod_{i=1}^{10^{8}} i",
    r"\binom{10^{9}}{10^{8}}",
    r"10^{(10^{10})}",
    r"e^{10^{10}}",
    r"x^{99}^{99}",
    "9**9**9",
    r"\frac{\frac{\frac{\frac{\frac{\frac{1}{2}}{3}}{4}}{5}}{6}}{7}",
    r"\sum_{i=1}^{10^9} i",
    r"\Gamma(10^9)",
    "100!",
    "\u0661\u0662\u0663",
    "1" * 13 + "^2",
]


@pytest.mark.parametrize("hostile", REVIEWED_HOSTILE)
def test_the_whitelist_screen_keeps_hostile_answers_from_math_verify(hostile: str, monkeypatch) -> None:
    from swarm_gdrive.training import dataset_task

    assert not dataset_task.safe_for_math(hostile)
    monkeypatch.setattr(dataset_task._MATH, "check", lambda *a: pytest.fail(f"{hostile!r} reached math-verify"))
    assert check_answer(hostile, "72", "math") == 0.0


@pytest.mark.parametrize(
    ("answer", "reference"),
    [(r"\frac{\sqrt{3}}{2}", r"\frac{\sqrt3}{2}"), ("x^2 + 1", "x^2+1"), ("10^{-3}", "0.001"), ("(3, -2)", "(3,-2)"),
     (r"2\pi", r"2\pi"), (r"\frac{\frac{1}{2}}{3}", r"\frac{1}{6}"), ("e^2", "e^2")],
)  # fmt: skip
def test_answers_of_the_usual_forms_pass_the_screen_and_verify(answer: str, reference: str) -> None:
    from swarm_gdrive.training.dataset_task import safe_for_math

    assert safe_for_math(answer) and check_answer(answer, reference, "math") == 1.0


def test_symbolic_blowups_within_the_whitelist_are_cut_the_same_in_every_thread() -> None:
    """A short polynomial power expands for a long time inside sympy (20 s for this one): math-verify runs in a
    process of its own, killed after MATH_TIMEOUT_SECONDS (0.0), the same in a thread (where a notebook runs its
    node, and SIGALRM timeouts would not work) as in the main one; the next check starts a new process."""
    import threading

    from swarm_gdrive.training.dataset_task import safe_for_math

    blowup = "(x+y+z)^{99}"
    assert safe_for_math(blowup) and check_answer(blowup, "72", "math") == 0.0
    assert check_answer("x^2 + 1", "1 + x^2") == 1.0  # a new process after the kill
    seen: list[float] = []
    thread = threading.Thread(
        target=lambda: seen.extend([check_answer(blowup, "72"), check_answer("x^2 + 1", "1+x^2")])
    )
    thread.start()
    thread.join(60)
    assert seen == [0.0, 1.0]


def test_math_verify_never_imports_a_module_planted_beside_the_nodes_working_directory(tmp_path, monkeypatch) -> None:
    """math-verify runs in a child process (``python -m``), which would put the working directory first on its path:
    a ``math_verify.py`` there (a node started from a folder anyone writes, even the shared one) must not run."""
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "ran"
    for name in ("math_verify", "sympy"):
        (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r})\n")
    checker = dataset_task._MathChecker()
    try:
        assert checker.check("1 + x^2", "x^2 + 1") == 1.0
    finally:
        checker._stop()
    assert not marker.exists(), marker.read_text()


def test_math_answers_without_math_verify_installed_are_refused_at_start_naming_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DATASET_ANSWER_CHECK=math without math-verify (datasets installed alone) used to fail at the first symbolic
    answer, mid-round; now the node refuses to start, naming the setting and the fix."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "math_verify" else real(name, *a))
    env = dataset_env(tmp_path)
    with pytest.raises(ConfigError, match=r"^DATASET_ANSWER_CHECK=math: math-verify is not installed \(pip install"):
        from_env(env)
    assert from_env({**env, "DATASET_ANSWER_CHECK": "numeric"}).dataset_answer_check == "numeric"


# -- loading ---------------------------------------------------------------------------------------------------------


def test_every_local_format_gives_the_same_rows_and_hash(tmp_path: Path) -> None:
    import datasets

    rows = gsm8k_rows(20)
    drive = str(tmp_path / "drive")
    jsonl = write_jsonl(tmp_path / "gsm.jsonl", rows)
    (tmp_path / "gsm.json").write_text(json.dumps(rows), encoding="utf-8")
    ds = datasets.Dataset.from_list(rows)
    ds.to_csv(tmp_path / "gsm.csv", index=False)
    ds.to_parquet(tmp_path / "gsm.parquet")
    ds.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "saved_dict"))
    (tmp_path / "folder").mkdir()
    write_jsonl(tmp_path / "folder" / "train.jsonl", rows)
    cache = str(tmp_path / "cache")
    hashes = set()
    for path in (jsonl, "gsm.json", "gsm.csv", "gsm.parquet", "saved", "saved_dict", "folder"):
        got = load_rows(str(tmp_path / path), None, "train", 1000, drive, cache)
        assert list(got) == rows, path
        hashes.add(DatasetTask(got, SEED, held_out=4).fingerprint)
    assert len(hashes) == 1
    assert len(load_rows(str(jsonl), None, "train", 7, drive, cache)) == 7  # DATASET_MAX_ROWS


def test_a_hub_id_loads_through_the_hub_the_same_rows_and_hash_as_a_local_copy(tmp_path: Path) -> None:
    """DATASET_PATH=owner/name when online: `datasets` asks the Hub (here tests/hub_server.py, a small Hub over HTTP
    that serves the repository from a folder; HF_ENDPOINT points a node process at it) and the rows, and so the
    task's hash, are those of the same file read locally."""
    import subprocess

    from hub_server import COMMIT, HubServer

    rows = gsm8k_rows(20)
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    write_jsonl(repo / "data" / "train.jsonl", rows)
    local = load_rows(str(repo / "data" / "train.jsonl"), None, "train", 1000, str(tmp_path / "drive"), None)
    script = (
        "import json, sys\n"
        "from swarm_gdrive.training.dataset_task import DatasetTask, load_rows\n"
        "rows = load_rows('me/apples', None, 'train', 1000, sys.argv[1], sys.argv[2])\n"
        "print(json.dumps({'rows': list(rows), 'fingerprint': DatasetTask(rows, 42, held_out=4).fingerprint}))\n"
    )
    with HubServer({"me/apples": repo}) as hub:
        env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
        env.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf-home"))
        result = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / "drive"), str(tmp_path / "cache")],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        asked = list(hub.requests)
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["rows"] == rows == list(local)
    assert got["fingerprint"] == DatasetTask(local, SEED, held_out=4).fingerprint
    assert ("GET", f"/datasets/me/apples/resolve/{COMMIT}/data/train.jsonl") in asked, asked


def test_a_dataset_inside_the_shared_folder_is_refused(tmp_path: Path) -> None:
    drive = tmp_path / "drive"
    drive.mkdir()
    path = write_jsonl(drive / "gsm.jsonl", gsm8k_rows(20))
    with pytest.raises(ValueError, match=r"DATASET_PATH=.*inside the shared folder GDRIVE_PATH"):
        load_rows(str(path), None, "train", 100, str(drive), None)


def test_a_dataset_over_the_cap_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_jsonl(tmp_path / "big.jsonl", gsm8k_rows(20))
    monkeypatch.setattr(dataset_task, "MAX_DATASET_BYTES", 100)
    with pytest.raises(ValueError, match=r"DATASET_PATH=.* bytes, over the 100-byte cap"):
        load_rows(str(path), None, "train", 99, str(tmp_path / "drive"), None)


def test_a_missing_dataset_offline_names_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match=r"DATASET_PATH='nobody/no-such-dataset' is not a local file or folder"):
        load_rows("nobody/no-such-dataset", None, "train", 10, str(tmp_path), str(tmp_path / "cache"))


def test_a_missing_column_is_named() -> None:
    with pytest.raises(ValueError, match=r"DATASET_QUESTION_COLUMN='problem': .* columns: question, answer"):
        DatasetTask(gsm8k_rows(), SEED, question_column="problem")


# -- the split and peers' groups --------------------------------------------------------------------------------------


def test_held_out_questions_are_never_drawn_even_as_duplicates() -> None:
    rows = gsm8k_rows(30)
    rows += [dict(r, question="  " + r["question"].upper().lower().replace(" ", "  ")) for r in rows[:30]]
    task = DatasetTask(rows, SEED, held_out=8)
    held = {normalise_question(q.question) for q in task.eval_questions("dataset", 8)}
    assert len(held) == 8
    drawn = task.draw(500, random.Random(0))
    assert not held & {normalise_question(q.question) for q in drawn}
    assert [q.question for q in DatasetTask(rows, SEED, held_out=8).eval_questions("dataset", 8)] == [
        q.question for q in task.eval_questions("dataset", 8)
    ]  # the same on every node
    assert DatasetTask(rows, SEED + 1, held_out=8).eval_questions("dataset", 8) != task.eval_questions("dataset", 8)


def test_too_few_questions_name_eval_samples() -> None:
    with pytest.raises(ValueError, match="EVAL_SAMPLES=16"):
        DatasetTask(gsm8k_rows(20), SEED, held_out=16)


def test_draws_are_determined_by_the_rng(task: DatasetTask) -> None:
    assert task.draw(5, random.Random(3)) == task.draw(5, random.Random(3))
    assert task.draw(5, random.Random(3)) != task.draw(5, random.Random(4))


def test_regenerate_accepts_an_honest_group_and_refuses_others(task: DatasetTask) -> None:
    (q,) = task.draw(1, random.Random(1))
    assert task.regenerate(group_for(q)) == q.entry
    assert task.regenerate(group_for(q, question=q.question + " Or fewer?")) is None
    other = DatasetTask(gsm8k_rows(offset=1), SEED, held_out=8)  # another copy: one column differs
    (theirs,) = other.draw(1, random.Random(1))
    assert task.regenerate(group_for(theirs)) is None
    prov = q.provenance
    assert task.regenerate(group_for(q, provenance=prov.model_copy(update={"seed": SEED + 1}))) is None
    assert task.regenerate(group_for(q, provenance=prov.model_copy(update={"index": 10_000}))) is None
    held = task.eval_questions("dataset", 1)[0]
    assert task.regenerate(group_for(held)) is None
    bogus = Provenance(dataset="chain_sum", config=prov.config, seed=SEED, index=prov.index)
    assert task.regenerate(group_for(q, provenance=bogus, task="chain_sum")) is None


def test_correctness_and_columns(task: DatasetTask) -> None:
    (q,) = task.draw(1, random.Random(1))
    right = int(q.entry["answer"].replace(",", ""))
    assert task.correctness(q.entry, f"Thinking. <answer>{right}</answer>") == 1.0
    assert task.correctness(q.entry, f"<answer>{right + 1}</answer>") == 0.0
    assert task.columns(q.entry) == task.rows[q.provenance.index]
    assert task.messages("Q?")[1] == {"role": "user", "content": "Q?"}
    custom = DatasetTask(gsm8k_rows(), SEED, held_out=8, system_prompt="Reply with a number in <answer></answer>.")
    assert custom.messages("Q?")[0] == {"role": "system", "content": "Reply with a number in <answer></answer>."}


# -- the reward and reward functions ---------------------------------------------------------------------------------


def test_the_reward_is_its_weighted_terms(task: DatasetTask) -> None:
    import task_rewards

    (q,) = task.draw(1, random.Random(1))
    reward = build_reward(task, 0.5, "task_rewards:brevity:0.1, task_rewards:mentions_answer:2", "/nonexistent")
    assert reward.names == ["correctness:1", "format:0.5", "task_rewards:brevity:0.1", "task_rewards:mentions_answer:2"]
    ans = q.entry["answer"]
    completions = [f"<answer>{ans}</answer>", "<answer>0</answer>", "I think " + ans + " " * 300]
    brevity = task_rewards.brevity([""] * 3, completions)
    scores = reward.score(q.entry, completions)
    assert scores == pytest.approx([1 + 0.5 + 0.1 * brevity[0] + 2, 0.5 + 0.1 * brevity[1], 0.1 * brevity[2] + 2])
    # TRL's signature: prompts and completions, and each column of the row, one value per completion.
    call = task_rewards.CALLS[-1]
    assert call["prompts"] == [q.question] * 3 and call["completions"] == completions
    assert call["answer"] == [task.rows[q.provenance.index]["answer"]] * 3


@pytest.mark.parametrize(
    ("function", "said"),
    [
        ("raises", "reward function task_rewards:raises raised KeyError"),
        ("wrong_length", "reward function task_rewards:wrong_length returned 3 values for 2 completions"),
        ("not_finite", "reward function task_rewards:not_finite returned non-finite values"),
    ],
)
def test_a_failing_reward_function_is_named(
    task: DatasetTask, function: str, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    (q,) = task.draw(1, random.Random(1))
    reward = build_reward(task, 0.0, f"task_rewards:{function}", "/nonexistent")
    with pytest.raises(RewardFunctionError, match=said):
        reward.probe(q.entry)
    # During a round: the group's term scores 0.0 with a WARNING that names it; the correctness term stands.
    ans = q.entry["answer"]
    with caplog.at_level(logging.WARNING):
        assert reward.score(q.entry, [f"<answer>{ans}</answer>", "no"]) == (1.0, 0.0)
    assert any(said in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


def test_a_worker_with_a_failing_reward_function_is_refused_at_start(tmp_path: Path) -> None:
    env = dataset_env(tmp_path, REWARD_FUNCTIONS="task_rewards:brevity,task_rewards:wrong_length:0.5")
    with pytest.raises(ConfigError) as info:
        from_env(env)
    assert str(info.value).startswith("REWARD_FUNCTIONS='task_rewards:brevity,task_rewards:wrong_length:0.5': ")
    assert "task_rewards:wrong_length returned 3 values for 2 completions" in str(info.value)
    assert "on a probe call" in str(info.value)
    # A coordinator does not run them: their names alone enter the fingerprint.
    assert from_env({**env, "NODE_ROLE": "coordinator"}).fingerprint_fields()["reward_functions"] == (
        "task_rewards:brevity:1,task_rewards:wrong_length:0.5"
    )


@pytest.mark.parametrize(
    ("text", "said"),
    [("task_rewards", "is not module:function"), ("a:b:x", "weight 'x'"), ("a:b,a:b:2", "appears twice")],
)
def test_reward_functions_setting_errors(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        parse_reward_functions(text)


def test_a_reward_module_inside_the_shared_folder_is_refused_before_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drive = tmp_path / "drive"
    drive.mkdir()
    (drive / "planted_rewards.py").write_text("import pathlib\npathlib.Path(__file__).with_name('RAN').touch()\n")
    monkeypatch.syspath_prepend(str(drive))
    with pytest.raises(ValueError, match=r"planted_rewards:f: .*planted_rewards.py is inside the shared folder"):
        load_reward_function("planted_rewards", "f", str(drive))
    assert not (drive / "RAN").exists() and "planted_rewards" not in sys.modules
    with pytest.raises(ValueError, match="no module 'not_a_module_anywhere'"):
        load_reward_function("not_a_module_anywhere", "f", str(drive))
    with pytest.raises(ValueError, match="has no function 'nope'"):
        load_reward_function("task_rewards", "nope", str(drive))


# -- the settings and the fingerprint --------------------------------------------------------------------------------


def dataset_env(tmp_path: Path, rows: list[dict[str, str]] | None = None, **extra: str) -> dict[str, str]:
    drive = tmp_path / "drive"
    drive.mkdir(exist_ok=True)
    data = write_jsonl(tmp_path / f"gsm-{len(list(tmp_path.glob('gsm-*')))}.jsonl", rows or gsm8k_rows())
    return {
        "GDRIVE_PATH": str(drive),
        "SWARM_LOCAL_DIR": str(tmp_path / "local"),
        "TASK_SOURCE": "datasets",
        "DATASET_PATH": str(data),
        "EVAL_SAMPLES": "8",
        **extra,
    }


def test_the_fingerprint_holds_the_rows_hash_and_names_a_different_copy(tmp_path: Path) -> None:
    mine = from_env(dataset_env(tmp_path)).fingerprint_fields()
    assert mine["task_source"] == "datasets" and mine["dataset_answer_check"] == "math"
    assert mine["dataset_rows_hash"] == DatasetTask(gsm8k_rows(), SEED, held_out=8).fingerprint
    same = from_env(dataset_env(tmp_path)).fingerprint_fields()  # another copy, the same rows
    assert same == mine
    edited = gsm8k_rows()
    edited[5] = dict(edited[5], answer=edited[5]["answer"] + "0")
    theirs = from_env(dataset_env(tmp_path, edited)).fingerprint_fields()
    assert {k for k in mine if mine[k] != theirs[k]} == {"dataset_rows_hash"}


def test_reasoning_gym_experiments_keep_their_fingerprint(tmp_path: Path) -> None:
    from swarm_gdrive.config import FINGERPRINT_FIELDS

    drive = tmp_path / "drive"
    drive.mkdir()
    config = from_env({"GDRIVE_PATH": str(drive), "SWARM_LOCAL_DIR": str(tmp_path / "l"), "WORKLOAD": "synthetic"})
    assert tuple(config.fingerprint_fields()) == FINGERPRINT_FIELDS


def test_dataset_settings_errors_name_the_variable(tmp_path: Path) -> None:
    env = dataset_env(tmp_path)
    with pytest.raises(ConfigError, match=r"^DATASET_PATH=<unset>: TASK_SOURCE=datasets needs"):
        from_env({k: v for k, v in env.items() if k != "DATASET_PATH"})
    with pytest.raises(ConfigError, match=r"^DATASET_ANSWER_COLUMN='solution': the dataset has no such column"):
        from_env({**env, "DATASET_ANSWER_COLUMN": "solution"})
    with pytest.raises(ConfigError, match=r"^EVAL_SAMPLES=40: the dataset has 60 distinct questions"):
        from_env({**env, "EVAL_SAMPLES": "40"})
    inside = write_jsonl(tmp_path / "drive" / "gsm.jsonl", gsm8k_rows())
    with pytest.raises(ConfigError, match=r"^DATASET_PATH='.*gsm.jsonl' is inside the shared folder"):
        from_env({**env, "DATASET_PATH": str(inside), "NODE_ROLE": "coordinator"})


def test_chat_template_is_read_from_this_node_only(tmp_path: Path) -> None:
    from swarm_gdrive.training.task_check import read_chat_template

    drive = tmp_path / "drive"
    drive.mkdir()
    mine = tmp_path / "chatml.jinja"
    mine.write_text("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>")
    assert read_chat_template(str(mine), str(drive)).startswith("{% for m in messages %}")
    planted = drive / "chatml.jinja"
    planted.write_text(mine.read_text())
    with pytest.raises(ValueError, match=r"^CHAT_TEMPLATE=.* is inside the shared folder GDRIVE_PATH"):
        read_chat_template(str(planted), str(drive))
    with pytest.raises(ValueError, match=r"^CHAT_TEMPLATE=.*: not a file of at most 256 KiB"):
        read_chat_template(str(tmp_path / "missing.jinja"), str(drive))


def test_a_synthetic_node_never_reads_a_dataset_for_its_fingerprint(tmp_path: Path, monkeypatch) -> None:
    """WORKLOAD=synthetic has no task: TASK_SOURCE=datasets without DATASET_PATH used to read the current folder as
    the dataset when the fingerprint was stated."""
    (tmp_path / "drive").mkdir()
    monkeypatch.chdir(tmp_path)
    env = {"GDRIVE_PATH": str(tmp_path / "drive"), "SWARM_LOCAL_DIR": str(tmp_path / "l"), "WORKLOAD": "synthetic"}
    plain = from_env({**env, "NODE_ROLE": "coordinator"})
    config = from_env({**env, "NODE_ROLE": "coordinator", "TASK_SOURCE": "datasets"})
    assert config.fingerprint() == plain.fingerprint()


def test_the_fingerprint_refuses_a_dataset_without_a_path(tmp_path: Path) -> None:
    from swarm_gdrive.training.task_check import dataset_rows_hash

    config = from_env(dataset_env(tmp_path))
    with pytest.raises(ConfigError, match=r"^DATASET_PATH=<unset>: TASK_SOURCE=datasets needs"):
        dataset_rows_hash(dataclasses.replace(config, dataset_path=""))


def test_chat_template_text_is_in_the_fingerprint_when_set(tmp_path: Path) -> None:
    one, two = tmp_path / "one.jinja", tmp_path / "two.jinja"
    one.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    two.write_text("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}")
    env = dataset_env(tmp_path)
    unset = from_env(env).fingerprint_fields()
    first = from_env({**env, "CHAT_TEMPLATE": str(one)}).fingerprint_fields()
    again = from_env({**env, "CHAT_TEMPLATE": str(one)}).fingerprint_fields()
    second = from_env({**env, "CHAT_TEMPLATE": str(two)}).fingerprint_fields()
    assert "chat_template_sha256" not in unset and first == again
    assert {k for k in second if second[k] != first[k]} == {"chat_template_sha256"}


def test_a_reward_function_that_changes_a_column_changes_no_row() -> None:
    rows = [dict(r, tags=["math"]) for r in gsm8k_rows()]
    task = DatasetTask(rows, SEED, held_out=8)
    (question,) = task.draw(1, random.Random(0))
    columns = task.columns(question.entry)
    columns["tags"].append("changed by a reward function")
    assert task.columns(question.entry)["tags"] == ["math"] and all(r["tags"] == ["math"] for r in task.rows)


def test_a_refused_worker_is_told_its_own_values_and_how_to_mend_a_dataset(tmp_path: Path) -> None:
    from swarm_gdrive.protocol.worker import ExperimentMismatchError, Worker

    events: list[tuple[str, str]] = []
    config = from_env(dataset_env(tmp_path))
    experiment = dict(config.fingerprint_fields(), dataset_rows_hash="0" * 16, partial_credit=False)
    me = SimpleNamespace(config=config, log=SimpleNamespace(event=lambda kind, msg, **_: events.append((kind, msg))))
    with pytest.raises(ExperimentMismatchError) as refused:
        Worker._refuse_other_settings(me, experiment)  # type: ignore[arg-type]
    said = str(refused.value)
    assert "PARTIAL_CREDIT=True (experiment: False)" in said  # its default, not None
    assert "use the same copy of the dataset as the coordinator (DATASET_PATH)" in said
    assert events and events[0][0] == "worker_refused"


def test_a_dataset_reports_its_near_twins_and_warns_when_a_run_exhausts_it(caplog) -> None:
    """Issue 31 point 5 for a dataset: the docs/tasks.md example's sizes (30 rows, 4 held out) with 2 workers x 2
    rounds x I=4 draws 16 of 26 trainable questions: more than half, a WARNING; a reworded held-out question counts as
    a near-twin and is never drawn."""
    from swarm_gdrive.training import twins

    rows = gsm8k_rows(30)
    task = DatasetTask(rows, SEED, held_out=4)
    held = task.eval_questions("dataset", 4)[0].question
    rows.append({"question": "  " + held.upper() + " ", "answer": "#### 1"})
    task = DatasetTask(rows, SEED, held_out=4)
    split = task.split(16)
    assert split.near_twins == 1 and split.crossing == 0 and split.held_out == 4 and split.exhausts
    with caplog.at_level("INFO", logger="swarm_gdrive.training.twins"):
        twins.log_splits([split])
    assert "1 with near-twins" in caplog.text and "the swarm draws about 16 training questions" in caplog.text
    assert not task.split(4).exhausts
    assert all(q.question != rows[-1]["question"] for q in task.draw(200, random.Random(1)))
