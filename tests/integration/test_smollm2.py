"""The packaged SmolLM2-135M-Instruct, offline: it loads, samples G completions, and one GRPO step moves it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swarm_gdrive.config import Config
from swarm_gdrive.training.models import load_model_and_tokenizer, resolve_model
from swarm_gdrive.training.policy import PolicyTrainer, TrainGroup, TrainSettings
from swarm_gdrive.training.rewards import ANSWER_OPEN
from swarm_gdrive.training.tasks import build_messages

pytestmark = pytest.mark.slow


def test_packaged_smollm2_generates_and_one_grpo_step_changes_every_parameter(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # proves nothing is fetched from a hub
    resolved = resolve_model("SmolLM2-135M-Instruct", Path(Config.model_cache_dir).expanduser())
    assert resolved.kind == "packaged" and (Path(resolved.source) / "model.safetensors").exists()
    device = torch.device("cpu")
    model, tokenizer = load_model_and_tokenizer(resolved.source, device, torch.float32)
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6

    settings = TrainSettings(max_new_tokens=12, learning_rate=1e-5, micro_batch_size=4, temperature=1.0)
    trainer = PolicyTrainer(model, tokenizer, settings, device)
    prompt = trainer.prompt_ids(build_messages("What is 7 + 5?"), ANSWER_OPEN)
    generation = trainer.generate([prompt], num_generations=4, seed=0)
    assert len(generation.texts) == 1 and len(generation.texts[0]) == 4
    assert all(0 < len(ids) <= 12 for ids in generation.token_ids[0])
    assert generation.new_tokens == sum(len(ids) for ids in generation.token_ids[0])

    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    metrics = trainer.step([TrainGroup(prompt, generation.token_ids[0], [0.0, 1.0, 0.0, 1.0])])
    unchanged = [name for name, p in model.named_parameters() if torch.equal(before[name], p)]
    assert not unchanged, unchanged
    assert metrics["train/active_sequences"] == 4 and metrics["train/grad_norm"] > 0
