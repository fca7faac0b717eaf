"""config.from_env: every variable parsed, defaults, presets, and every error message."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from swarm_gdrive import config as config_module
from swarm_gdrive.config import TEST_MODE_PRESET, Config, ConfigError, env_fields, from_env

TOKEN = "hf_SECRET_token_value_123"
NAME_FIX = "use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit (no '/', no '..')"
INT_FIX = "use a whole number >= {}"
SECONDS_FIX = "use a number of seconds > 0, for example 30 or 0.5"
BOOL_FIX = "use true or false (also 1/0, yes/no, on/off)"
MOUNT_FIX = (
    "this folder does not exist: create it, or mount Google Drive first "
    "(in Colab: from google.colab import drive; drive.mount('/content/drive'))"
)
UNSET_FIX = "set it to the shared folder, e.g. /content/drive/MyDrive/rl-swarm"


@pytest.fixture
def base(tmp_path: Path) -> dict[str, str]:
    """The smallest valid environment: a shared folder and a node-local folder."""
    shared = tmp_path / "shared"
    shared.mkdir()
    return {"GDRIVE_PATH": str(shared), "SWARM_LOCAL_DIR": str(tmp_path / "local")}


def config_error(env: dict[str, str]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        from_env(env)
    return info.value


def assert_one_line(err: ConfigError, var: str, value: object) -> None:
    message = str(err)
    assert "\n" not in message and "\r" not in message
    assert message.startswith(f"{var}=")
    shown = "<unset>" if value is None else repr(value)
    assert message.startswith(f"{var}={shown}: ")
    assert err.var == var


# -- every variable --------------------------------------------------------------------------

# var -> (raw value, field name, parsed value, extra variables the value needs to be valid)
VALID: dict[str, tuple[str, str, object, dict[str, str]]] = {
    "EXPERIMENT_NAME": (" exp-1.b_2 ", "experiment_name", "exp-1.b_2", {}),
    "NODE_ROLE": (" Coordinator ", "node_role", "coordinator", {}),
    "NODE_ID": ("node-7", "node_id", "node-7", {}),
    "MODEL_NAME": (" org/Tiny-Model ", "model_name", "org/Tiny-Model", {}),
    "SEED": ("0", "seed", 0, {}),
    "TEST_MODE": ("yes", "test_mode", True, {}),
    "MAX_ROUNDS": ("17", "max_rounds", 17, {}),
    "NUM_TRAIN_SAMPLES": ("3", "num_train_samples", 3, {}),
    "NUM_GENERATIONS": ("5", "num_generations", 5, {}),
    "NUM_TRANSPLANT_TREES": ("0", "num_transplant_trees", 0, {}),
    "NUM_STAGES": ("2", "num_stages", 2, {}),
    "MIN_WORKERS": ("4", "min_workers", 4, {}),
    "COORDINATOR_ROUND_INTERVAL": ("2.5", "coordinator_round_interval", 2.5, {}),
    "SYNC_LAG": (" 90 ", "sync_lag", 90.0, {}),
    "ROLLOUT_PUBLISH_FREQUENCY": ("ROUND", "rollout_publish_frequency", "round", {}),
    "ROLLOUT_CLEANUP_ENABLED": ("on", "rollout_cleanup_enabled", True, {}),
    "ROLLOUT_KEEP_LAST_N_ROUNDS": ("3", "rollout_keep_last_n_rounds", 3, {}),
    "ROLLOUT_ARCHIVE_OLD": ("1", "rollout_archive_old", True, {"ROLLOUT_CLEANUP_ENABLED": "true"}),
    "HUGGINGFACE_ACCESS_TOKEN": (f" {TOKEN} ", "huggingface_access_token", TOKEN, {}),
    "HEARTBEAT_INTERVAL": ("5", "heartbeat_interval", 5.0, {}),
    "LIVENESS_TIMEOUT": ("30.5", "liveness_timeout", 30.5, {}),
    "ROLLOUT_WAIT_TIMEOUT": ("0.25", "rollout_wait_timeout", 0.25, {}),
    "COORDINATOR_WAIT_TIMEOUT": ("1e3", "coordinator_wait_timeout", 1000.0, {}),
    "POLL_INTERVAL_MIN": ("0.1", "poll_interval_min", 0.1, {}),
    "POLL_INTERVAL_MAX": ("2", "poll_interval_max", 2.0, {}),
    "WORKLOAD": ("Synthetic", "workload", "synthetic", {}),
    "SYNTHETIC_STEP_SECONDS": ("0.002", "synthetic_step_seconds", 0.002, {}),
    "RESET_EXPERIMENT": ("TRUE", "reset_experiment", True, {}),
    "COORDINATOR_TAKEOVER": ("yes", "coordinator_takeover", True, {}),
    "COORDINATOR_KEY_FILE": ("/tmp/keys/k.pem", "coordinator_key_file", "/tmp/keys/k.pem", {}),
    "REPIN_COORDINATOR_KEY": ("true", "repin_coordinator_key", True, {}),
    "LOG_LEVEL": ("debug", "log_level", "DEBUG", {}),
    "PROGRESS": (" Lines ", "progress", "lines", {}),
    "REPORT_TO": (" TensorBoard,tensorboard ", "report_to", "tensorboard", {}),
    "TRACKING_DIR": ("/tmp/runs", "tracking_dir", "/tmp/runs", {}),
    "TRACKING_PROJECT": ("my-project", "tracking_project", "my-project", {}),
    "TASKS": (" chain_sum:2,basic_arithmetic ", "tasks", "chain_sum:2,basic_arithmetic", {"WORKLOAD": "grpo"}),
    "TASK_CONFIG": (
        '{"chain_sum": {"min_terms": 2}}',
        "task_config",
        '{"chain_sum":{"min_terms":2}}',
        {"WORKLOAD": "grpo", "TASKS": "chain_sum"},
    ),
    "MAX_NEW_TOKENS": ("64", "max_new_tokens", 64, {}),
    "ANSWER_EXTRACTION": ("Lenient", "answer_extraction", "lenient", {}),
    "PARTIAL_CREDIT": ("False", "partial_credit", False, {}),
    # The paper mix's easy propositional_logic has 4 distinct questions: too few to hold any out.
    "TASK_DIFFICULTY": ("EASY", "task_difficulty", "easy", {"TASKS": "chain_sum,basic_arithmetic"}),
    "GOOGLE_APPLICATION_CREDENTIALS": (" /keys/sa.json ", "google_application_credentials", "/keys/sa.json", {}),
    "GDRIVE_TOKEN_FILE": ("/keys/token.json", "gdrive_token_file", "/keys/token.json", {}),
    "GDRIVE_API_URL": ("http://127.0.0.1:8080/", "gdrive_api_url", "http://127.0.0.1:8080/", {}),
    "PYDRIVE2_SETTINGS": ("/keys/settings.yaml", "pydrive2_settings", "/keys/settings.yaml", {}),
    "SAPO_MAX_PEERS": ("0", "sapo_max_peers", 0, {}),
    "ROUND_MODE": (" Async ", "round_mode", "async", {}),
    "MAX_STALENESS_SECONDS": ("0", "max_staleness_seconds", 0.0, {}),
    "MAX_STALENESS_ROUNDS": ("3", "max_staleness_rounds", 3, {}),
    "EXPERIMENT_DEADLINE_MINUTES": (" 90.5 ", "experiment_deadline_minutes", 90.5, {}),
    "CURRICULUM_THRESHOLD": (
        "0.8",
        "curriculum_threshold",
        0.8,
        {"TASK_DIFFICULTY": "easy", "TASKS": "chain_sum,basic_arithmetic"},
    ),
    "EVAL_INTERVAL": ("0", "eval_interval", 0, {}),
    "EVAL_BEFORE_TRAINING": ("off", "eval_before_training", False, {}),
    "LOG_SETTINGS": ("Full", "log_settings", "full", {}),
    "EVAL_SAMPLES": ("8", "eval_samples", 8, {}),
    "EVAL_PASS_K": ("4", "eval_pass_k", 4, {}),
    "ANSWER_PREFIX": ("on", "answer_prefix", True, {}),
    "TEMPERATURE": ("0.7", "temperature", 0.7, {}),
    "TOP_P": ("0.9", "top_p", 0.9, {}),
    "LEARNING_RATE": ("5e-6", "learning_rate", 5e-6, {}),
    "WARMUP_STEPS": ("10", "warmup_steps", 10, {}),
    "WEIGHT_DECAY": ("0", "weight_decay", 0.0, {}),
    "MAX_GRAD_NORM": ("0.5", "max_grad_norm", 0.5, {}),
    "MICRO_BATCH_SIZE": ("4", "micro_batch_size", 4, {}),
    "GEN_BATCH_SIZE": ("32", "gen_batch_size", 32, {}),
    "NUM_ITERATIONS": ("2", "num_iterations", 2, {}),
    "SCALE_REWARDS": ("None", "scale_rewards", "none", {}),
    "LOSS_TYPE": ("DAPO", "loss_type", "dapo", {}),
    "BETA": ("0.04", "beta", 0.04, {}),
    "EPSILON": ("0.1", "epsilon", 0.1, {}),
    "EPSILON_HIGH": ("0.3", "epsilon_high", 0.3, {}),
    "FORMAT_REWARD_WEIGHT": ("0.2", "format_reward_weight", 0.2, {}),
    "CHECKPOINT_INTERVAL": ("5", "checkpoint_interval", 5, {}),
    "CHECKPOINT_MINUTES": ("7.5", "checkpoint_minutes", 7.5, {}),
    "STOP_CHECKPOINT_MIN_SECONDS": ("0", "stop_checkpoint_min_seconds", 0.0, {}),
    "KEEP_CHECKPOINTS": ("3", "keep_checkpoints", 3, {}),
    "CHECKPOINT_OPTIMIZER": (" BF16 ", "checkpoint_optimizer", "bf16", {}),
    "DEVICE": ("CUDA:1", "device", "cuda:1", {}),
    "CPU_ONLY": ("yes", "cpu_only", True, {}),
    "TORCH_THREADS": ("3", "torch_threads", 3, {}),
    "PRECISION": (" FP16 ", "precision", "fp16", {}),
    "WEIGHT_DTYPE": (" BF16 ", "weight_dtype", "bf16", {}),
    "LORA_R": ("16", "lora_r", 16, {}),
    "LORA_ALPHA": ("8", "lora_alpha", 8.0, {}),
    "LORA_DROPOUT": ("0.05", "lora_dropout", 0.05, {}),
    "LORA_TARGET_MODULES": (" q_proj, v_proj,q_proj ", "lora_target_modules", "q_proj,v_proj", {}),
    "GRADIENT_CHECKPOINTING": ("on", "gradient_checkpointing", True, {}),
    "HUB_PUSH_INTERVAL": ("4", "hub_push_interval", 4, {}),
    "HUB_REPO_ID": (" me/my-model ", "hub_repo_id", "me/my-model", {}),
    # A dataset is read only by a node that trains (or states its fingerprint): tests/unit/test_dataset_task.py.
    "TASK_SOURCE": (" Datasets ", "task_source", "datasets", {"WORKLOAD": "synthetic"}),
    "DATASET_PATH": (" /data/gsm8k.jsonl ", "dataset_path", "/data/gsm8k.jsonl", {}),
    "DATASET_CONFIG": ("main", "dataset_config", "main", {}),
    "DATASET_SPLIT": (" test ", "dataset_split", "test", {}),
    "DATASET_QUESTION_COLUMN": ("problem", "dataset_question_column", "problem", {}),
    "DATASET_ANSWER_COLUMN": ("solution", "dataset_answer_column", "solution", {}),
    "DATASET_ANSWER_CHECK": (" Numeric ", "dataset_answer_check", "numeric", {}),
    "DATASET_SYSTEM_PROMPT": (
        "Answer in <answer></answer>.",
        "dataset_system_prompt",
        "Answer in <answer></answer>.",
        {},
    ),
    "DATASET_MAX_ROWS": ("500", "dataset_max_rows", 500, {}),
    "CHAT_TEMPLATE": ("/templates/chatml.jinja", "chat_template", "/templates/chatml.jinja", {}),
    "REWARD_FUNCTIONS": (
        "my_rewards:brevity:0.1",
        "reward_functions",
        "my_rewards:brevity:0.1",
        {"WORKLOAD": "synthetic"},
    ),
}


def test_valid_table_covers_every_variable() -> None:
    special = {"GDRIVE_PATH", "SWARM_LOCAL_DIR", "MODEL_CACHE_DIR"}  # need real folders: tested below
    assert set(VALID) | special == {f.metadata["env"] for f in env_fields()}


def test_every_field_names_its_variable_and_has_help() -> None:
    names = [f.metadata["env"] for f in env_fields()]
    assert len(names) == len(set(names))
    for f in env_fields():
        assert f.metadata["help"].strip(), f.name
        assert callable(f.metadata["parse"]), f.name


@pytest.mark.parametrize("var", sorted(VALID))
def test_every_variable_is_parsed(var: str, base: dict[str, str]) -> None:
    raw, name, expected, extra = VALID[var]
    config = from_env({**base, **extra, var: raw})
    value = getattr(config, name)
    assert value == expected
    assert type(value) is type(expected)


def test_gdrive_path_and_local_dir_are_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    config = from_env({"GDRIVE_PATH": f" {tmp_path}/./shared ", "SWARM_LOCAL_DIR": "~/node-local"})
    assert config.gdrive_path == str(shared.resolve())
    assert config.local_dir == str(tmp_path / "node-local")


def test_gdrive_path_expands_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "drive").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    assert from_env({"GDRIVE_PATH": "~/drive"}).gdrive_path == str((tmp_path / "drive").resolve())


def test_defaults(base: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    config = from_env({"GDRIVE_PATH": base["GDRIVE_PATH"]})
    expected = {
        "google_application_credentials": None,
        "gdrive_token_file": None,
        "gdrive_api_url": None,
        "pydrive2_settings": "settings.yaml",
        "experiment_name": "swarm-experiment",
        "node_role": "worker",
        "node_id": None,
        "model_name": "Gensyn/Qwen2.5-0.5B-Instruct",
        "seed": 42,
        "test_mode": False,
        "max_rounds": 2000,
        "num_train_samples": 8,
        "num_generations": 8,
        "num_transplant_trees": 0,
        "sapo_max_peers": 8,
        "num_stages": 1,
        "min_workers": 1,
        "sync_lag": 0.0,
        "round_mode": "auto",
        "max_staleness_seconds": 1800.0,
        "max_staleness_rounds": 0,
        "coordinator_round_interval": 60.0,
        "experiment_deadline_minutes": 0.0,
        "rollout_publish_frequency": "stage",
        "rollout_cleanup_enabled": False,
        "rollout_keep_last_n_rounds": 10,
        "rollout_archive_old": False,
        "huggingface_access_token": None,
        "heartbeat_interval": 10.0,
        "liveness_timeout": 120.0,
        "rollout_wait_timeout": 30.0,
        "coordinator_wait_timeout": 3600.0,
        "poll_interval_min": 0.5,
        "poll_interval_max": 10.0,
        "workload": "grpo",
        "synthetic_step_seconds": 0.01,
        "local_dir": str(tmp_path / ".cache" / "swarm-gdrive"),
        "model_cache_dir": str(tmp_path / ".cache" / "swarm-gdrive" / "models"),
        "reset_experiment": False,
        "coordinator_takeover": False,
        "coordinator_key_file": None,
        "repin_coordinator_key": False,
        "log_level": "INFO",
        "progress": "auto",
        "report_to": "none",
        "tracking_dir": None,
        "tracking_project": "swarm-gdrive",
        "tasks": None,
        "task_config": None,
        "task_source": "reasoning_gym",
        "dataset_path": None,
        "dataset_config": None,
        "dataset_split": "train",
        "dataset_question_column": "question",
        "dataset_answer_column": "answer",
        "dataset_answer_check": "math",
        "dataset_system_prompt": None,
        "dataset_max_rows": 100_000,
        "chat_template": None,
        "reward_functions": None,
        "answer_extraction": "strict",
        "partial_credit": True,
        "answer_prefix": False,
        "task_difficulty": "paper",
        "curriculum_threshold": 0.0,
        "eval_interval": 10,
        "eval_before_training": True,
        "log_settings": "short",
        "eval_samples": 16,
        "eval_pass_k": 0,
        "max_new_tokens": 256,
        "temperature": 1.0,
        "top_p": 1.0,
        "learning_rate": 1e-6,
        "warmup_steps": 0,
        "weight_decay": 0.01,
        "max_grad_norm": 1.0,
        "micro_batch_size": 8,
        "gen_batch_size": 64,
        "num_iterations": 1,
        "scale_rewards": "group",
        "loss_type": "grpo",
        "beta": 0.0,
        "epsilon": 0.2,
        "epsilon_high": 0.28,
        "format_reward_weight": 0.0,
        "checkpoint_interval": 0,
        "checkpoint_minutes": 30.0,
        "stop_checkpoint_min_seconds": 60.0,
        "keep_checkpoints": 1,
        "checkpoint_optimizer": "auto",
        "device": "auto",
        "cpu_only": False,
        "torch_threads": 0,
        "precision": "auto",
        "weight_dtype": "auto",
        "lora_r": 0,
        "lora_alpha": 32.0,
        "lora_dropout": 0.0,
        "lora_target_modules": "all-linear",
        "gradient_checkpointing": False,
        "hub_push_interval": 10,
        "hub_repo_id": None,
    }
    actual = dataclasses.asdict(config)
    assert actual.pop("gdrive_path") == str(Path(base["GDRIVE_PATH"]).resolve())
    assert actual == expected
    assert not config.is_coordinator


def test_reads_os_environ_when_no_mapping(base: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for f in env_fields():
        monkeypatch.delenv(f.metadata["env"], raising=False)
    for var, value in base.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("NODE_ROLE", "coordinator")
    config = from_env()
    assert config.is_coordinator
    assert config.gdrive_path == str(Path(base["GDRIVE_PATH"]).resolve())


def test_optional_values_empty_mean_unset(base: dict[str, str]) -> None:
    config = from_env({**base, "NODE_ID": "  ", "HUGGINGFACE_ACCESS_TOKEN": ""})
    assert config.node_id is None
    assert config.huggingface_access_token is None


# -- errors ----------------------------------------------------------------------------------


def test_unknown_role(base: dict[str, str]) -> None:
    err = config_error({**base, "NODE_ROLE": "boss"})
    assert str(err) == "NODE_ROLE='boss': use one of coordinator, worker"
    assert_one_line(err, "NODE_ROLE", "boss")


@pytest.mark.parametrize(
    ("var", "raw", "choices"),
    [
        ("ROLLOUT_PUBLISH_FREQUENCY", "hourly", "generation, stage, round"),
        ("ROUND_MODE", "both", "auto, sync, async"),
        ("WORKLOAD", "reasoning", "grpo, synthetic"),
        ("LOSS_TYPE", "ppo", "grpo, bnpo, dr_grpo, dapo"),
        ("SCALE_REWARDS", "std", "group, batch, none"),
        ("PRECISION", "fp8", "auto, bf16, fp16, fp32"),
        ("WEIGHT_DTYPE", "int8", "auto, fp32, bf16, fp16"),
        ("LOG_LEVEL", "verbose", "DEBUG, INFO, WARNING, ERROR"),
    ],
)
def test_unknown_choice(base: dict[str, str], var: str, raw: str, choices: str) -> None:
    err = config_error({**base, var: raw})
    assert str(err) == f"{var}={raw!r}: use one of {choices}"


@pytest.mark.parametrize(
    ("var", "raw", "minimum"),
    [
        ("NUM_TRAIN_SAMPLES", "0", 1),
        ("MAX_ROUNDS", "-1", 1),
        ("MAX_ROUNDS", "abc", 1),
        ("MAX_ROUNDS", "2.5", 1),
        ("MAX_ROUNDS", "", 1),
        ("NUM_TRANSPLANT_TREES", "-1", 0),
        ("NUM_STAGES", "0", 1),
        ("MIN_WORKERS", "0", 1),
        ("ROLLOUT_KEEP_LAST_N_ROUNDS", "0", 1),
        ("SEED", "-5", 0),
        ("SEED", "forty-two", 0),
        ("MAX_STALENESS_ROUNDS", "-1", 0),
    ],
)
def test_bad_counts(base: dict[str, str], var: str, raw: str, minimum: int) -> None:
    err = config_error({**base, var: raw})
    assert str(err) == f"{var}={raw!r}: {INT_FIX.format(minimum)}"
    assert_one_line(err, var, raw)


def test_bounded_counts_name_both_bounds(base: dict[str, str]) -> None:
    for var, raw, top in (
        ("NUM_GENERATIONS", "0", 64),
        ("NUM_GENERATIONS", "65", 64),
        ("MAX_NEW_TOKENS", "5000", 4096),
    ):
        err = config_error({**base, var: raw})
        assert str(err) == f"{var}={raw!r}: use a whole number >= 1 and <= {top}"


@pytest.mark.parametrize("raw", ["-1", "inf", "nan", "half an hour"])
def test_max_staleness_seconds_is_a_finite_number_of_seconds_from_0(base: dict[str, str], raw: str) -> None:
    err = config_error({**base, "MAX_STALENESS_SECONDS": raw})
    assert str(err) == f"MAX_STALENESS_SECONDS={raw!r}: use a number in [0, inf]"


@pytest.mark.parametrize("raw", ["-5", "inf", "nan", "2h", "2000000"])
def test_experiment_deadline_minutes_is_a_number_of_minutes_from_0(base: dict[str, str], raw: str) -> None:
    err = config_error({**base, "EXPERIMENT_DEADLINE_MINUTES": raw})
    assert str(err) == f"EXPERIMENT_DEADLINE_MINUTES={raw!r}: use a number in [0, 1e+06]"


def test_zero_transplant_trees_is_plain_grpo(base: dict[str, str]) -> None:
    assert from_env({**base, "NUM_TRANSPLANT_TREES": "0"}).num_transplant_trees == 0


@pytest.mark.parametrize("var", ["TEST_MODE", "ROLLOUT_CLEANUP_ENABLED", "ROLLOUT_ARCHIVE_OLD", "RESET_EXPERIMENT"])
@pytest.mark.parametrize("raw", ["maybe", "2", "tru"])
def test_bad_bools(base: dict[str, str], var: str, raw: str) -> None:
    err = config_error({**base, var: raw})
    assert str(err) == f"{var}={raw!r}: {BOOL_FIX}"


@pytest.mark.parametrize(("raw", "expected"), [("1", True), ("Yes", True), ("off", False), ("0", False), ("", False)])
def test_bool_spellings(base: dict[str, str], raw: str, expected: bool) -> None:
    assert from_env({**base, "RESET_EXPERIMENT": raw}).reset_experiment is expected


@pytest.mark.parametrize("raw", ["0", "-1", "abc", "inf", "Infinity", "-inf", "nan", "1e400", ""])
@pytest.mark.parametrize("var", ["HEARTBEAT_INTERVAL", "COORDINATOR_ROUND_INTERVAL", "SYNTHETIC_STEP_SECONDS"])
def test_bad_seconds(base: dict[str, str], var: str, raw: str) -> None:
    err = config_error({**base, var: raw})
    assert str(err) == f"{var}={raw!r}: {SECONDS_FIX}"
    assert_one_line(err, var, raw)


@pytest.mark.parametrize("raw", ["../x", "/", "", ".hidden", "a/b", "..", "a\\b", "x.tmp", "a" * 65, "-lead"])
def test_bad_experiment_names(base: dict[str, str], raw: str) -> None:
    err = config_error({**base, "EXPERIMENT_NAME": raw})
    assert str(err) == f"EXPERIMENT_NAME={raw!r}: {NAME_FIX}"
    assert_one_line(err, "EXPERIMENT_NAME", raw)


@pytest.mark.parametrize("raw", ["../x", "/", ".hidden", "a/b", "..", "node id", "x.tmp"])
def test_bad_node_ids(base: dict[str, str], raw: str) -> None:
    err = config_error({**base, "NODE_ID": raw})
    assert str(err) == f"NODE_ID={raw!r}: {NAME_FIX}"
    assert_one_line(err, "NODE_ID", raw)


def test_error_with_newline_in_value_stays_one_line(base: dict[str, str]) -> None:
    err = config_error({**base, "NODE_ROLE": "boss\nevil"})
    assert str(err) == "NODE_ROLE='boss\\nevil': use one of coordinator, worker"
    assert_one_line(err, "NODE_ROLE", "boss\nevil")


@pytest.mark.parametrize("raw", ["", "   "])
def test_empty_text_is_rejected(base: dict[str, str], raw: str) -> None:
    for var in ("MODEL_NAME", "SWARM_LOCAL_DIR"):
        err = config_error({**base, var: raw})
        assert str(err) == f"{var}={raw!r}: set a non-empty value or unset the variable"


def test_gdrive_path_unset(tmp_path: Path) -> None:
    err = config_error({"SWARM_LOCAL_DIR": str(tmp_path)})
    assert str(err) == f"GDRIVE_PATH=<unset>: {UNSET_FIX}"
    assert_one_line(err, "GDRIVE_PATH", None)
    assert err.value is None


def test_gdrive_path_empty(tmp_path: Path) -> None:
    err = config_error({"GDRIVE_PATH": "  "})
    assert str(err) == f"GDRIVE_PATH='  ': {UNSET_FIX}"


def test_gdrive_path_missing_folder(tmp_path: Path) -> None:
    missing = str(tmp_path / "not-mounted")
    err = config_error({"GDRIVE_PATH": missing})
    assert str(err) == f"GDRIVE_PATH={missing!r}: {MOUNT_FIX}"
    assert_one_line(err, "GDRIVE_PATH", missing)


def test_gdrive_path_is_a_file(tmp_path: Path) -> None:
    file = tmp_path / "a-file"
    file.write_text("x")
    err = config_error({"GDRIVE_PATH": str(file)})
    assert str(err) == f"GDRIVE_PATH={str(file)!r}: this is a file, not a folder: point it at the shared folder"


def test_gdrive_path_unwritable(tmp_path: Path) -> None:
    folder = tmp_path / "readonly"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("running as root: os.access reports every folder writable (see the monkeypatched test)")
        err = config_error({"GDRIVE_PATH": str(folder)})
    finally:
        folder.chmod(0o700)
    assert str(err) == f"GDRIVE_PATH={str(folder)!r}: this folder is not writable by this user: fix its permissions"


def test_gdrive_path_unwritable_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same check as above, with the permission answer forced so that it also runs as root."""
    calls: list[tuple[str, int]] = []

    def no_write(path: os.PathLike[str] | str, mode: int) -> bool:
        calls.append((str(path), mode))
        return False

    monkeypatch.setattr(config_module.os, "access", no_write)
    err = config_error({"GDRIVE_PATH": str(tmp_path)})
    assert str(err) == f"GDRIVE_PATH={str(tmp_path)!r}: this folder is not writable by this user: fix its permissions"
    assert calls == [(str(tmp_path), os.W_OK | os.X_OK)]


# -- relations between variables -------------------------------------------------------------


@pytest.mark.parametrize("liveness", ["20", "15"])
def test_liveness_must_exceed_two_heartbeats(base: dict[str, str], liveness: str) -> None:
    err = config_error({**base, "HEARTBEAT_INTERVAL": "10", "LIVENESS_TIMEOUT": liveness})
    assert str(err) == f"LIVENESS_TIMEOUT={float(liveness)!r}: must exceed 2 x HEARTBEAT_INTERVAL (20 s)"
    assert_one_line(err, "LIVENESS_TIMEOUT", float(liveness))


def test_liveness_just_above_two_heartbeats_is_fine(base: dict[str, str]) -> None:
    config = from_env({**base, "HEARTBEAT_INTERVAL": "10", "LIVENESS_TIMEOUT": "20.5"})
    assert config.liveness_timeout == 20.5


def test_default_liveness_against_large_heartbeat(base: dict[str, str]) -> None:
    err = config_error({**base, "HEARTBEAT_INTERVAL": "60"})
    assert str(err) == "LIVENESS_TIMEOUT=120.0: must exceed 2 x HEARTBEAT_INTERVAL (120 s)"


def test_poll_max_below_min(base: dict[str, str]) -> None:
    err = config_error({**base, "POLL_INTERVAL_MIN": "2", "POLL_INTERVAL_MAX": "1.5"})
    assert str(err) == "POLL_INTERVAL_MAX=1.5: must be >= POLL_INTERVAL_MIN (2 s)"
    assert_one_line(err, "POLL_INTERVAL_MAX", 1.5)


def test_poll_max_equal_min_is_fine(base: dict[str, str]) -> None:
    config = from_env({**base, "POLL_INTERVAL_MIN": "2", "POLL_INTERVAL_MAX": "2"})
    assert (config.poll_interval_min, config.poll_interval_max) == (2.0, 2.0)


def test_archive_without_cleanup(base: dict[str, str]) -> None:
    err = config_error({**base, "ROLLOUT_ARCHIVE_OLD": "true"})
    assert str(err) == (
        "ROLLOUT_ARCHIVE_OLD='true': archiving happens during cleanup: also set ROLLOUT_CLEANUP_ENABLED=true"
    )
    assert_one_line(err, "ROLLOUT_ARCHIVE_OLD", "true")


# -- TEST_MODE preset ------------------------------------------------------------------------


def test_test_mode_preset(base: dict[str, str]) -> None:
    env = {**base, "TEST_MODE": "1"}
    config = from_env(env)
    assert config.test_mode is True
    assert (config.max_rounds, config.num_train_samples, config.num_generations) == (3, 4, 4)
    assert config.eval_before_training is False  # a quick check starts training at once
    assert TEST_MODE_PRESET == {
        "MAX_ROUNDS": "3",
        "NUM_TRAIN_SAMPLES": "4",
        "NUM_GENERATIONS": "4",
        "EVAL_BEFORE_TRAINING": "false",
    }
    assert env == {**base, "TEST_MODE": "1"}  # the caller's mapping is not modified


def test_explicit_variables_override_test_mode(base: dict[str, str]) -> None:
    config = from_env({**base, "TEST_MODE": "true", "MAX_ROUNDS": "7", "NUM_GENERATIONS": "2"})
    assert (config.max_rounds, config.num_train_samples, config.num_generations) == (7, 4, 2)


def test_explicit_override_is_still_validated(base: dict[str, str]) -> None:
    err = config_error({**base, "TEST_MODE": "true", "MAX_ROUNDS": "0"})
    assert str(err) == "MAX_ROUNDS='0': use a whole number >= 1"


def test_no_preset_without_test_mode(base: dict[str, str]) -> None:
    config = from_env({**base, "TEST_MODE": "false"})
    assert (config.max_rounds, config.num_train_samples, config.num_generations) == (2000, 8, 8)


# -- secrets, fingerprint, immutability ------------------------------------------------------


def test_token_never_shown(base: dict[str, str]) -> None:
    config = from_env({**base, "HUGGINGFACE_ACCESS_TOKEN": TOKEN})
    assert config.huggingface_access_token == TOKEN
    described = config.describe()
    assert described["HUGGINGFACE_ACCESS_TOKEN"] == "<set>"
    assert TOKEN not in json.dumps(described)
    assert TOKEN not in repr(config)
    assert TOKEN not in str(config)


def test_describe_lists_every_variable(base: dict[str, str]) -> None:
    config = from_env({**base, "MAX_ROUNDS": "9"})
    described = config.describe()
    assert set(described) == {f.metadata["env"] for f in env_fields()}
    assert described["MAX_ROUNDS"] == 9
    assert described["HUGGINGFACE_ACCESS_TOKEN"] == "<unset>"
    json.dumps(described)  # safe to log as JSON
    assert described["GDRIVE_PATH"] == config.gdrive_path


def test_fingerprint(base: dict[str, str]) -> None:
    first = from_env(base).fingerprint()
    assert first == from_env(base).fingerprint()
    assert len(first) == 16 and int(first, 16) >= 0
    assert from_env({**base, "SEED": "43"}).fingerprint() != first
    assert from_env({**base, "EXPERIMENT_NAME": "other"}).fingerprint() != first
    assert from_env({**base, "MAX_ROUNDS": "5"}).fingerprint() == first
    assert from_env({**base, "NODE_ROLE": "coordinator", "NODE_ID": "c"}).fingerprint() == first


def test_fingerprint_fields(base: dict[str, str]) -> None:
    fields = from_env({**base, "SEED": "7"}).fingerprint_fields()
    assert fields == {
        "experiment_name": "swarm-experiment",
        "model_name": "Gensyn/Qwen2.5-0.5B-Instruct",
        "seed": 7,
        "num_train_samples": 8,
        "num_generations": 8,
        "num_transplant_trees": 0,
        "num_stages": 1,
        "workload": "grpo",
        "tasks": None,
        "task_config": None,
        "answer_extraction": "strict",
        "answer_prefix": False,
        "format_reward_weight": 0.0,
        "task_difficulty": "paper",
        "curriculum_threshold": 0.0,
    }


def test_partial_credit_off_is_in_the_fingerprint_and_its_default_is_not(base: dict[str, str]) -> None:
    """PARTIAL_CREDIT changes every reward, so false defines another experiment; true (the default, today's scoring)
    leaves the fingerprint of an experiment created before the setting as it was."""
    default, off = from_env(base), from_env({**base, "PARTIAL_CREDIT": "false"})
    assert "partial_credit" not in default.fingerprint_fields()
    assert off.fingerprint_fields()["partial_credit"] is False and off.fingerprint() != default.fingerprint()
    assert from_env({**base, "PARTIAL_CREDIT": "true"}).fingerprint() == default.fingerprint()


def test_config_is_frozen(base: dict[str, str]) -> None:
    config = from_env(base)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_rounds = 5  # type: ignore[misc]
    assert config.max_rounds == 2000
    assert isinstance(config, Config)


@pytest.mark.parametrize(
    ("env", "var", "needle"),
    [
        ({"TASKS": "nosuch"}, "TASKS", "unknown task 'nosuch'"),
        ({"TASKS": "chain_sum:-1"}, "TASKS", "not a positive number"),
        ({"TASK_CONFIG": "[1]"}, "TASK_CONFIG", "expected a JSON object"),
        ({"TASKS": "chain_sum", "TASK_CONFIG": '{"chain_sum": {"bogus": 1}}'}, "TASK_CONFIG", "valid keys"),
        ({"TASKS": "countdown"}, "TASKS", "would run code written by other nodes"),
    ],
)
def test_task_mix_errors_name_the_variable(base: dict[str, str], env: dict[str, str], var: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_env({**base, **env})
    message = str(info.value)
    assert info.value.var == var and message.startswith(f"{var}:") and needle in message
    assert "\n" not in message


def test_task_mix_is_not_checked_for_the_coordinator_or_synthetic(base: dict[str, str]) -> None:
    assert from_env({**base, "TASKS": "nosuch", "NODE_ROLE": "coordinator"}).tasks == "nosuch"
    assert from_env({**base, "TASKS": "nosuch", "WORKLOAD": "synthetic"}).tasks == "nosuch"


def test_curriculum_needs_the_easy_preset_and_evaluation(base: dict[str, str]) -> None:
    for extra in ({}, {"TASK_DIFFICULTY": "easy", "EVAL_INTERVAL": "0"}):
        with pytest.raises(ConfigError) as info:
            from_env({**base, "WORKLOAD": "synthetic", "CURRICULUM_THRESHOLD": "0.5", **extra})
        assert info.value.var == "CURRICULUM_THRESHOLD" and "TASK_DIFFICULTY=easy" in str(info.value)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("gdrive://1AbCdEfGhIjKlMnOp/rl-swarm", "gdrive://1AbCdEfGhIjKlMnOp/rl-swarm"),
        ("gdrive://1AbCdEfGhIjKlMnOp", "gdrive://1AbCdEfGhIjKlMnOp"),
        ("pydrive2://1AbCdEfGhIjKlMnOp/rl-swarm/", "pydrive2://1AbCdEfGhIjKlMnOp/rl-swarm"),
        ("s3://my-bucket/swarm/", "s3://my-bucket/swarm"),
        ("memory://root", "memory://root"),
    ],
)
def test_gdrive_path_takes_drive_and_fsspec_urls(tmp_path: Path, raw: str, expected: str) -> None:
    config = from_env({"GDRIVE_PATH": raw, "SWARM_LOCAL_DIR": str(tmp_path), "WORKLOAD": "synthetic"})
    assert config.gdrive_path == expected


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ("gdrive://short/x", "folder id"),
        ("pydrive2://short/x", "pydrive2://<id>/path"),
        ("gdrive://1AbCdEfGhIjKlMnOp/../x", "not a safe name"),
        ("s3:///x", "bucket"),
    ],
)
def test_bad_storage_urls_name_the_problem(tmp_path: Path, raw: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_env({"GDRIVE_PATH": raw, "SWARM_LOCAL_DIR": str(tmp_path)})
    assert info.value.var == "GDRIVE_PATH" and needle in str(info.value)


def test_docs_settings_is_generated_from_config() -> None:
    """docs/settings.md is `swarm-gdrive env --markdown`: a field added, renamed or re-documented without
    regenerating it fails here (and every variable is in it)."""
    from swarm_gdrive.config import settings_markdown

    page = (Path(__file__).resolve().parents[2] / "docs" / "settings.md").read_text(encoding="utf-8")
    assert page == settings_markdown(), "run: swarm-gdrive env --markdown > docs/settings.md"
    for f in env_fields():
        assert f"| `{f.metadata['env']}` |" in page


@pytest.mark.parametrize("raw", ["", "q_proj;v_proj", "all-linear,q_proj", "1proj", "x" * 65])
def test_lora_target_modules_must_be_all_linear_or_module_names(base: dict[str, str], raw: str) -> None:
    err = config_error({**base, "LORA_TARGET_MODULES": raw})
    assert "use all-linear, or a comma list of module names such as q_proj" in str(err)


def test_device_accepts_mps_and_names_it_when_wrong(base: dict[str, str]) -> None:
    assert from_env({**base, "DEVICE": " MPS "}).device == "mps"
    assert "mps (Apple silicon)" in str(config_error({**base, "DEVICE": "metal"}))


@pytest.mark.parametrize(
    ("path", "lag", "mode"),
    [
        ("/content/drive/MyDrive/rl-swarm", 0.0, "sync"),  # a local folder that does not lag
        ("/content/drive/MyDrive/rl-swarm", 90.0, "async"),  # a Drive mount, Drive for desktop
        ("gdrive://1AbC/rl-swarm", 0.0, "sync"),  # the Drive API: every node sees a write at once
        ("s3://bucket/rl-swarm", 30.0, "async"),
    ],
)
def test_round_mode_auto_is_async_where_the_folder_lags(path: str, lag: float, mode: str) -> None:
    from swarm_gdrive.config import auto_round_mode

    assert auto_round_mode(path, lag) == mode


def test_an_explicit_round_mode_wins_and_auto_keeps_an_existing_experiments(base: dict[str, str]) -> None:
    auto = from_env({**base, "SYNC_LAG": "90"})
    assert auto.round_mode == "auto"
    assert (auto.resolved_round_mode(), auto.resolved_round_mode("sync")) == ("async", "sync")
    explicit = from_env({**base, "SYNC_LAG": "90", "ROUND_MODE": "sync"})
    assert (explicit.resolved_round_mode(), explicit.resolved_round_mode("async")) == ("sync", "sync")
