"""GRPO + SAPO with a tiny real model: a coordinator and 2 workers as real processes, and resume."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from swarm_gdrive.procs import NodeProcess, stop_all
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import EventRecord, MetricRecord, RewardRecord, decode, decode_lines

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tracking_readers import tensorboard_scalars  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]
LAYOUT = Layout("train")
N_LOCAL, N_GEN, N_EXT = 4, 4, 1


@pytest.fixture(scope="module")
def model_dir(taught_tiny_folder) -> Path:
    return taught_tiny_folder  # tests/conftest.py: built once per session, for every worker


def training_env(folder: Path, model: Path, **extra: object) -> dict[str, str]:
    env = {
        "GDRIVE_PATH": str(folder),
        "EXPERIMENT_NAME": "train",
        "SWARM_LOCAL_DIR": str(folder.parent / "local"),
        "MODEL_NAME": str(model),
        "WORKLOAD": "grpo",
        "TASKS": "basic_arithmetic",
        "TASK_CONFIG": '{"basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}',
        "NUM_TRAIN_SAMPLES": str(N_LOCAL),
        "NUM_GENERATIONS": str(N_GEN),
        "NUM_TRANSPLANT_TREES": str(N_EXT),
        "FORMAT_REWARD_WEIGHT": "0.5",
        "MAX_NEW_TOKENS": "12",
        "LEARNING_RATE": "1e-4",
        "CHECKPOINT_INTERVAL": "1",
        "DEVICE": "cpu",
        "OMP_NUM_THREADS": "1",
        "HEARTBEAT_INTERVAL": "0.5",
        "LIVENESS_TIMEOUT": "120",
        "POLL_INTERVAL_MIN": "0.05",
        "POLL_INTERVAL_MAX": "0.5",
        "COORDINATOR_ROUND_INTERVAL": "300",
        "ROLLOUT_WAIT_TIMEOUT": "120",
    }
    return {**env, **{k: str(v) for k, v in extra.items()}}


def wait_until(predicate, timeout: float, what: str, nodes: list[NodeProcess]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {n.name}\n" + "\n".join(n.lines[-20:]) for n in nodes)
            raise AssertionError(f"timed out waiting for {what}\n{logs}")
        time.sleep(0.05)


def test_two_workers_train_on_local_and_external_groups(tmp_path, model_dir):
    folder = tmp_path / "drive"
    folder.mkdir()
    runs = tmp_path / "runs"
    env = training_env(folder, model_dir, MAX_ROUNDS=3, MIN_WORKERS=2, REPORT_TO="tensorboard", TRACKING_DIR=runs)
    nodes = [NodeProcess("coordinator", {**env, "NODE_ROLE": "coordinator", "NODE_ID": "coordinator"})]
    # w2 is a smaller machine's worker: LoRA adapters and gradient checkpointing; peers of either kind swap groups.
    lora = {"LORA_R": "4", "LORA_ALPHA": "8", "GRADIENT_CHECKPOINTING": "true"}
    nodes += [NodeProcess(w, {**env, "NODE_ID": w, **(lora if w == "w2" else {})}) for w in ("w1", "w2")]
    try:
        codes = {n.name: n.wait(timeout=300) for n in nodes}
    finally:
        stop_all([n for n in nodes if n.returncode is None], timeout=5)
    assert codes == {"coordinator": 0, "w1": 0, "w2": 0}, [n.lines[-10:] for n in nodes]

    initial = load_file(str(model_dir / "model.safetensors"))
    final = load_file(str(folder / LAYOUT.checkpoint_dir("w1", 2) / "model.safetensors"))
    unchanged = [name for name, tensor in initial.items() if torch.equal(tensor, final[name])]
    assert not unchanged, f"w1: parameters that never changed: {unchanged}"
    saved = folder / LAYOUT.checkpoint_dir("w2", 2)
    assert not (saved / "model.safetensors").exists()  # LoRA: the adapters alone, the base is MODEL_NAME
    adapters = load_file(str(saved / "adapter_model.safetensors"))
    assert adapters and all(t.abs().sum() > 0 for name, t in adapters.items() if "lora_B" in name), "untrained"
    (w2,) = [n for n in nodes if n.name == "w2"]
    assert any("training LoRA adapters (r=4, all-linear)" in line and "AdamW state fp32" in line for line in w2.lines)
    for w in ("w1", "w2"):
        metrics, problems = decode_lines((folder / LAYOUT.metrics_file(w)).read_bytes(), MetricRecord)
        assert not problems
        stages = {m.round: m.values for m in metrics if "swarm/local_groups" in m.values}
        assert sorted(stages) == [0, 1, 2]
        for round_, v in stages.items():
            assert v["swarm/local_groups"] == N_LOCAL, (w, round_, v)
            assert v["swarm/external_used"] == N_EXT, (w, round_, v)
            assert v["train/sequences"] == (N_LOCAL + N_EXT) * N_GEN, (w, round_, v)
            # Peers of one model: an external completion is trained on its sampled ids, or re-tokenised only
            # where the sender shared none (a special token sampled mid-completion); never a refused id.
            assert v["external/completions"] == N_EXT * N_GEN, (w, round_, v)
            assert v["external/sampled_ids"] + v["external/retokenized"] == N_EXT * N_GEN, (w, round_, v)
            assert v["external/ids_rejected"] == 0, (w, round_, v)
            for key in (
                "train/loss",
                "train/grad_norm",
                "gen/tokens_per_s",
                "train/tokens_per_s",
                "train/peak_memory_mb",
                "reward/local_mean",
                "reward/local_accuracy",
                "reward/local_zero_variance_fraction",
                "completion/length_mean",
                "train/step_s",
            ):
                assert key in v, (w, round_, key)
        for round_ in range(3):
            reward = decode((folder / LAYOUT.reward_file(round_, 0, w)).read_bytes(), RewardRecord)
            assert reward.num_local_groups == N_LOCAL and reward.num_external_groups == N_EXT
        # The round lines (output is a pipe here: PROGRESS=auto writes lines, no bars).
        (node,) = [n for n in nodes if n.name == w]
        said = [line for line in node.lines if " done (" in line]
        assert [line.split("swarm_gdrive.protocol.worker: ")[-1][:22] for line in said] == [
            "round 0 done (1 of 3, ",
            "round 1 done (2 of 3, ",
            "round 2 done (3 of 3, ",
        ], said
        assert "to go, about" in said[0] and "\r" not in "".join(node.lines)
        # REPORT_TO=tensorboard: a real GRPO step's metrics reach TensorBoard under TRL's names, each round.
        scalars = tensorboard_scalars(runs / "tensorboard" / "train" / w)
        for name in (
            "train/loss",
            "train/grad_norm",
            "train/learning_rate",
            "train/reward",
            "train/reward_std",
            "train/frac_reward_zero_std",
            "train/completions/mean_length",
            "swarm/external_used",
        ):
            assert [step for step, _ in scalars[name]] == [0, 1, 2], (w, name)
        submitted = [stages[r]["reward/local_mean"] for r in range(3)]
        assert [v for _, v in scalars["train/reward"]] == pytest.approx(submitted)


def _complete(manifest: Path) -> bool:
    try:
        return json.loads(manifest.read_text()).get("complete") is True
    except (OSError, ValueError):
        return False


def test_a_killed_worker_resumes_from_its_checkpoint_at_the_next_round(tmp_path, model_dir):
    folder = tmp_path / "drive"
    folder.mkdir()
    env = training_env(folder, model_dir, MAX_ROUNDS=4, MIN_WORKERS=1, NUM_TRANSPLANT_TREES=0)
    coordinator = NodeProcess("coordinator", {**env, "NODE_ROLE": "coordinator", "NODE_ID": "coordinator"})
    worker = NodeProcess("w1", {**env, "NODE_ID": "w1"})
    nodes = [coordinator, worker]
    try:
        manifest = folder / LAYOUT.checkpoint_dir("w1", 1) / "checkpoint.json"
        # The manifest is written first with complete: false (checkpoint.save): a kill before the second write
        # leaves an interrupted save, which resume rightly skips. Wait for the complete one.
        wait_until(lambda: _complete(manifest), 240, "the round-1 checkpoint", nodes)
        worker.kill()
        saved = load_file(str(manifest.parent / "model.safetensors"))
        again = NodeProcess("w1-restarted", {**env, "NODE_ID": "w1"})
        nodes.append(again)
        assert again.wait(timeout=300) == 0, again.lines[-20:]
        assert coordinator.wait(timeout=60) == 0
    finally:
        stop_all([n for n in nodes if n.returncode is None], timeout=5)

    events, _ = decode_lines((folder / LAYOUT.events_file("w1")).read_bytes(), EventRecord)
    (resumed,) = [e for e in events if e.event == "resumed_from_checkpoint"]
    latest = resumed.data["checkpoint_round"]
    assert latest >= 1
    if latest == 1:  # the kill came before a later checkpoint: the restored weights are exactly round 1's
        from swarm_gdrive.training.checkpoint import param_digest

        class Holder(torch.nn.Module):
            def state_dict(self, *args, **kwargs):
                return saved

        assert resumed.data["params"] == param_digest(Holder())
    metrics, _ = decode_lines((folder / LAYOUT.metrics_file("w1")).read_bytes(), MetricRecord)
    after = [m.round for m in metrics if m.ts > resumed.ts and "swarm/local_groups" in m.values]
    assert after and after[0] == latest + 1, after
    for round_ in range(4):
        assert (folder / LAYOUT.reward_file(round_, 0, "w1")).exists()


def test_the_hub_token_never_reaches_a_log_or_the_shared_folder(tmp_path, model_dir):
    token = "hf_SECRETtoken0123456789"
    folder = tmp_path / "drive"
    folder.mkdir()
    env = training_env(
        folder,
        model_dir,
        MAX_ROUNDS=1,
        MIN_WORKERS=1,
        NUM_TRANSPLANT_TREES=0,
        HUB_PUSH_INTERVAL=1,
        HUGGINGFACE_ACCESS_TOKEN=token,
        HF_ENDPOINT="http://127.0.0.1:9",
        LOG_LEVEL="DEBUG",
    )
    nodes = [
        NodeProcess("coordinator", {**env, "NODE_ROLE": "coordinator", "NODE_ID": "coordinator"}),
        NodeProcess("w1", {**env, "NODE_ID": "w1"}),
    ]
    try:
        codes = [n.wait(timeout=120) for n in nodes]
    finally:
        stop_all([n for n in nodes if n.returncode is None], timeout=5)
    assert codes == [0, 0]
    output = "\n".join(line for n in nodes for line in n.lines)
    assert "push to the Hub failed" in output  # the push was attempted (and the endpoint refused it)
    assert "HUGGINGFACE_ACCESS_TOKEN': '<set>'" in output
    assert token not in output
    for file in folder.rglob("*"):
        if file.is_file():
            assert token.encode() not in file.read_bytes(), file


def test_workers_write_eval_records_every_interval_and_the_report_plots_them(tmp_path, model_dir):
    import subprocess

    from swarm_gdrive.protocol.records import EvalRecord

    folder = tmp_path / "drive"
    folder.mkdir()
    env = training_env(
        folder,
        model_dir,
        MAX_ROUNDS=4,
        MIN_WORKERS=2,
        EVAL_INTERVAL=2,
        EVAL_SAMPLES=4,
        EVAL_PASS_K=2,
        NUM_TRAIN_SAMPLES=2,
        CHECKPOINT_INTERVAL=100,
    )
    nodes = [NodeProcess("coordinator", {**env, "NODE_ROLE": "coordinator", "NODE_ID": "coordinator"})]
    nodes += [NodeProcess(w, {**env, "NODE_ID": w}) for w in ("w1", "w2")]
    try:
        codes = [n.wait(timeout=300) for n in nodes]
    finally:
        stop_all([n for n in nodes if n.returncode is None], timeout=5)
    assert codes == [0, 0, 0], [n.lines[-10:] for n in nodes]
    for w in ("w1", "w2"):
        rounds = sorted(p.parent.name for p in (folder / LAYOUT.evals_dir).glob(f"round_*/{w}.json"))
        assert rounds == ["round_0", "round_2", "round_4"]  # before rounds 0 and 2, and after the last (3)
        for name in rounds:
            record = decode((folder / LAYOUT.evals_dir / name / f"{w}.json").read_bytes(), EvalRecord)
            (result,) = record.results
            assert (result.task, result.n, result.k) == ("basic_arithmetic", 4, 2)
            assert result.pass_k is not None and result.level == 0  # sampled pass@k measured besides pass@1
            # Each accuracy with its standard error: the binomial sqrt(p (1 - p) / n) for the pass rates.
            assert result.pass1_se == pytest.approx((result.pass1 * (1 - result.pass1) / 4) ** 0.5)
            assert result.pass_k_se == pytest.approx((result.pass_k * (1 - result.pass_k) / 4) ** 0.5)
            assert result.mean_score_se is not None
        metrics, _ = decode_lines((folder / LAYOUT.metrics_file(w)).read_bytes(), MetricRecord)
        assert sorted(m.round for m in metrics if "eval/pass1" in m.values) == [0, 2, 4]
        assert all("eval/pass1_se" in m.values for m in metrics if "eval/pass1" in m.values)

    out = tmp_path / "report"
    result = subprocess.run(
        ["swarm-gdrive", "report", "--folder", str(folder), "--experiment", "train", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    evals = (out / "evals.csv").read_text().splitlines()
    assert evals[0].startswith("node,round,task,level,n,pass1") and len(evals) == 1 + 2 * 3
    assert (out / "eval_pass1.png").stat().st_size > 10_000
    page = (out / "index.html").read_text()
    assert "eval_pass1.png" in page and "reward_per_round.png" in page
