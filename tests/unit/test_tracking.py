"""REPORT_TO: metric names as TRL logs them, the setting's errors, and a tracker that fails never stops a node."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from swarm_gdrive.config import ConfigError, from_env
from swarm_gdrive.protocol import settings as protocol_settings
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.metrics import NodeLog
from swarm_gdrive.protocol.tracking import TRL_KEYS, Tracking, tracker_key, tracking_for, wandb_id
from swarm_gdrive.storage import LocalStorage

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tracking_readers import tensorboard_scalars  # noqa: E402

#: What transformers' Trainer itself logs at each logging step (TRL's GRPOTrainer adds its own metrics to these).
TRAINER_KEYS = {"loss", "grad_norm", "learning_rate"}


def trl_grpo_metric_names() -> set[str]:
    """Every metric name TRL's GRPOTrainer logs, read from the installed TRL's source."""
    import trl.trainer.grpo_trainer as grpo

    source = Path(grpo.__file__).read_text()
    return set(re.findall(r'_metrics\[mode\]\["([^"]+)"\]', source))


def test_each_trl_name_is_one_trl_logs_and_what_only_a_swarm_has_is_under_swarm():
    """The instrument: the names are checked against the installed TRL, so a misspelt or renamed one fails."""
    trl_names = trl_grpo_metric_names()
    assert {"reward", "frac_reward_zero_std", "kl", "completions/mean_length"} <= trl_names  # the reader works
    for ours, theirs in TRL_KEYS.items():
        assert theirs.startswith("train/"), theirs
        assert theirs.removeprefix("train/") in trl_names | TRAINER_KEYS, (ours, theirs)
        assert tracker_key(ours) == theirs
    own = [
        "reward/external_mean",
        "reward/local_accuracy",
        "reward/local_max",
        "storage/reads",
        "storage/backend_api_calls",
        "round/seconds",
        "swarm/live_workers",
        "stage",
        "completion/length_min",
        "train/tokens_per_s",
        "eval/pass1",
        "eval/leg_counting/pass1",
        "external/resampled",
        "gen/tokens_per_s",
        "time/train_s",
    ]
    mapped = {k: tracker_key(k) for k in own}
    assert all(v.split("/")[0] in ("train", "eval", "swarm", "gen", "time") for v in mapped.values()), mapped
    assert mapped["external/resampled"] == "swarm/external/resampled" and mapped["time/train_s"] == "time/train_s"
    assert mapped["reward/external_mean"] == "swarm/external_reward_mean"
    assert mapped["storage/reads"] == "swarm/storage/reads" and mapped["round/seconds"] == "swarm/round/seconds"
    assert mapped["eval/pass1"] == "eval/pass1" and mapped["stage"] == "swarm/stage"
    assert len(set(mapped.values())) == len(mapped)


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"GDRIVE_PATH": str(tmp_path), "SWARM_LOCAL_DIR": f"{tmp_path}-local", **extra}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("", "none"), ("none", "none"), (" TensorBoard , wandb,tensorboard", "tensorboard,wandb"), ("trackio", "trackio")],
)
def test_report_to_is_normalized(tmp_path, raw, expected):
    config = from_env(env(tmp_path, REPORT_TO=raw))
    assert config.report_to == expected
    assert config.trackers == (() if expected == "none" else tuple(expected.split(",")))


def test_report_to_errors_name_the_setting_and_the_fix(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"REPORT_TO='mlflow': use none, all, or a comma list of tensorboard"):
        from_env(env(tmp_path, REPORT_TO="mlflow"))
    with pytest.raises(ConfigError, match="REPORT_TO='none,wandb'"):
        from_env(env(tmp_path, REPORT_TO="none,wandb"))
    monkeypatch.setattr(protocol_settings, "_installed", lambda package: package != "wandb")
    with pytest.raises(ConfigError) as err:
        from_env(env(tmp_path, REPORT_TO="tensorboard,wandb"))
    assert "the wandb package is not installed: pip install 'swarm-gdrive[wandb]'" in str(err.value)
    assert from_env(env(tmp_path, REPORT_TO="all")).trackers == ("tensorboard", "trackio")  # what is installed


def test_a_tracker_that_fails_is_dropped_and_the_metric_lines_go_on(tmp_path, monkeypatch, caplog):
    config = from_env(env(tmp_path, REPORT_TO="tensorboard", EXPERIMENT_NAME="exp", TRACKING_DIR=f"{tmp_path}-tb"))
    tracking = tracking_for(config, "w1")
    log = NodeLog(LocalStorage(tmp_path), Layout("exp"), "w1")
    log.sinks.append(tracking.log)
    tracking.start("0123456789abcdef")
    assert tracking.active == ("tensorboard",)
    log.metric({"train/loss": 0.5, "reward/local_mean": 0.25, "swarm/live_workers": 3}, round_=0)

    def broken(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(Tracking, "_log_tensorboard", staticmethod(broken))
    log.metric({"train/loss": 0.4}, round_=1)  # the tracker fails: dropped, logged once
    log.metric({"train/loss": 0.3}, round_=2)
    tracking.close()
    assert tracking.active == ()
    assert [r.getMessage() for r in caplog.records if "REPORT_TO=tensorboard" in r.getMessage()] == [
        "REPORT_TO=tensorboard: logging failed (OSError: disk full); dropping it"
    ]
    assert log.flush() and len((tmp_path / "experiments/exp/logs/w1/metrics.jsonl").read_text().split()) == 3
    scalars = tensorboard_scalars(Path(f"{tmp_path}-tb") / "tensorboard" / "exp" / "w1")
    assert scalars["train/loss"] == [(0, 0.5)] and scalars["train/reward"] == [(0, 0.25)]


def test_a_tracker_that_cannot_start_leaves_the_node_without_it(tmp_path, monkeypatch, caplog):
    config = from_env(env(tmp_path, REPORT_TO="tensorboard", TRACKING_DIR=f"{tmp_path}-tb"))
    tracking = tracking_for(config, "w1")

    def refuse(self: Tracking, run_id: str) -> None:
        raise PermissionError("read-only file system")

    monkeypatch.setattr(Tracking, "_open_tensorboard", refuse)
    tracking.start("0123456789abcdef")
    tracking.log({"train/loss": 1.0}, 0)  # nothing open: nothing happens
    assert tracking.active == ()
    assert any("could not start (PermissionError" in r.getMessage() for r in caplog.records)


def test_wandb_ids_are_short_stable_and_distinct():
    assert wandb_id("exp", "0123456789abcdef", "w1") == "exp-0123456789abcdef-w1"
    long_a, long_b = wandb_id("e" * 64, "0123456789abcdef", "a" * 64), wandb_id("e" * 64, "0123456789abcdef", "b" * 64)
    assert len(long_a) == len(long_b) == 64 and long_a != long_b
    assert long_a == wandb_id("e" * 64, "0123456789abcdef", "a" * 64)  # a restart resumes the same run
    assert wandb_id("my exp", "0123456789abcdef", "node/1") == "my-exp-0123456789abcdef-node-1"
