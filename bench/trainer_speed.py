"""Generation and GRPO-step speed of this project's trainer on one device.

Measures, on the same model and prompts: batched generation (all prompts x G in as few
``generate`` calls as GEN_BATCH_SIZE allows) against one ``generate`` call per completion
(how the original project generated), and the time and peak memory of one GRPO update.
With ``--random-init`` the model is built from its config with random weights: speed and
memory are those of the architecture, rewards are meaningless (the update is fed fixed
alternating rewards so that it always runs).

    python bench/trainer_speed.py --model SmolLM2-135M-Instruct --device cuda --out bench/results/x.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from swarm_gdrive.models import load_model_and_tokenizer, resolve_model
from swarm_gdrive.tasks import build_messages
from swarm_gdrive.trainer import PolicyTrainer, TrainGroup, TrainSettings, peak_memory_mb, pick_device

QUESTIONS = [
    f"What is {a} + {b}? Explain your steps, then answer."
    for a, b in [(3, 4), (12, 9), (7, 15), (21, 8), (5, 5), (30, 12), (9, 27), (14, 6)]
]


def load(model: str, device: torch.device, random_init: bool, cache: Path):
    source = resolve_model(model, cache).source if not Path(model).is_dir() else model
    if not random_init:
        return load_model_and_tokenizer(source, device, torch.float32)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    torch.manual_seed(0)
    net = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source), dtype=torch.float32).to(device)
    net.generation_config.pad_token_id = tokenizer.pad_token_id
    return net, tokenizer


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--random-init", action="store_true")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--single-calls", type=int, default=4, help="one-completion generate calls to time")
    parser.add_argument("--cache", default=str(Path("~/.cache/swarm-gdrive/models").expanduser()))
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    device = pick_device(args.device, cpu_only=False)
    model, tokenizer = load(args.model, device, args.random_init, Path(args.cache))
    settings = TrainSettings(
        max_new_tokens=args.new_tokens,
        micro_batch_size=args.micro_batch,
        gen_batch_size=args.prompts * args.generations,
        learning_rate=1e-6,
    )
    trainer = PolicyTrainer(model, tokenizer, settings, device)
    prompts = [trainer.prompt_ids(build_messages(q)) for q in QUESTIONS[: args.prompts]]
    # Force full-length completions so both generation modes produce the same number of tokens.
    model.generation_config.min_new_tokens = args.new_tokens
    trainer.generate(prompts[:1], 2, seed=0)  # warm-up

    sync(device)
    batched = trainer.generate(prompts, args.generations, seed=1)
    sync(device)
    one_by_one_tokens, started = 0, time.monotonic()
    single = TrainSettings(**{**settings.__dict__, "gen_batch_size": 1})
    trainer_single = PolicyTrainer(model, tokenizer, single, device)
    for call in range(args.single_calls):  # a sample of calls: the rate, not the total, is compared
        out = trainer_single.generate([prompts[call % len(prompts)]], 1, seed=100 + call)
        one_by_one_tokens += out.new_tokens
    sync(device)
    one_by_one_s = time.monotonic() - started

    groups = [
        TrainGroup(p, ids, [float(i % 2) for i in range(len(ids))])
        for p, ids in zip(prompts, batched.token_ids, strict=True)
    ]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    step = trainer.step(groups)
    sync(device)
    result = {
        "machine": platform.node(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "model": args.model,
        "random_init": args.random_init,
        "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
        "prompts": args.prompts,
        "generations": args.generations,
        "new_tokens": args.new_tokens,
        "batched_generate_tokens_per_s": batched.new_tokens / batched.seconds,
        "one_call_per_completion_tokens_per_s": one_by_one_tokens / one_by_one_s,
        "batched_over_one_by_one": (batched.new_tokens / batched.seconds) / (one_by_one_tokens / one_by_one_s),
        "grpo_step_s": step["train/step_s"],
        "grpo_step_tokens_per_s": step["train/tokens_per_s"],
        "grpo_step_sequences": step["train/sequences"],
        "peak_memory_mb": peak_memory_mb(device),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
