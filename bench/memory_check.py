"""The memory estimate (swarm_gdrive/training/memory.py) against a real trainer's peak, and a round's time.

Each case runs in a fresh Python process: it imports torch, transformers and the trainer, loads the packaged
SmolLM2 tokenizer and reads its resident-set high-water mark (``ru_maxrss``) as the **baseline**; then
builds the model (the packaged SmolLM2-135M-Instruct, or random weights of a table architecture through
``AutoModelForCausalLM.from_config``: memory and speed are the architecture's), applies LoRA and gradient
checkpointing as ``grpo_workload`` does (``training.adapters``), and plays two rounds of a worker's work with
a real ``PolicyTrainer``: ``generate`` I prompts x G completions, then ``step`` on the I local groups and J
copies standing in for external ones, rewards alternating 0/1 so that every sequence trains (the worst
case). The second round generates with gradients and AdamW's state allocated, as every later round does.

The **measured** peak is the high-water mark minus the baseline; the **estimate** is
``memory.estimate(...)`` minus its runtime overhead, for the prompt length the case really had and
MAX_NEW_TOKENS completion tokens (random weights rarely stop early; the packaged model may, so its
estimate is an upper bound). Round time is the second round's generate + update, on this machine's cores.

``python -m bench memory [--cases a,b] [--tag T]``; writes ``bench/results/memory_<tag>.json`` and ``.md``
(tag: ``cpu-<cores>c-<date>``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import machine_info, machine_line, machine_tag, markdown_table, source_version, write_result
from swarm_gdrive.training import memory

#: Each case: the model ("packaged" or a memory.KNOWN name with random weights) and the settings that differ from
#: :class:`memory.Settings`'s. Sized for about a minute or two each on 2 cores.
CASES: dict[str, dict[str, Any]] = {
    "demo-135m": {  # swarm-gdrive demo's worker: SMALL_MODEL_PRESET, J = 1
        "model": "packaged", "num_train_samples": 4, "num_generations": 4, "num_transplant_trees": 1,
        "max_new_tokens": 24, "answer_prefix": True,
    },
    "demo-135m-lora": {
        "model": "packaged", "num_train_samples": 4, "num_generations": 4, "num_transplant_trees": 1,
        "max_new_tokens": 24, "answer_prefix": True, "lora_r": 16,
    },
    "135m-t64": {"model": "SmolLM2-135M", "num_train_samples": 4, "num_generations": 4, "max_new_tokens": 64},
    "135m-t128": {"model": "SmolLM2-135M", "num_train_samples": 2, "num_generations": 4, "max_new_tokens": 128},
    "135m-t128-ckpt": {
        "model": "SmolLM2-135M", "num_train_samples": 2, "num_generations": 4, "max_new_tokens": 128,
        "gradient_checkpointing": True,
    },
    "135m-t128-lora": {
        "model": "SmolLM2-135M", "num_train_samples": 2, "num_generations": 4, "max_new_tokens": 128, "lora_r": 16,
    },
    "135m-beta": {
        "model": "SmolLM2-135M", "num_train_samples": 2, "num_generations": 4, "max_new_tokens": 64, "beta": 0.04,
    },
    "135m-gen64-mb1": {  # generation sets the peak: 64 sequences in one generate call, micro-batches of one
        "model": "SmolLM2-135M", "num_train_samples": 8, "num_generations": 8, "max_new_tokens": 48,
        "micro_batch_size": 1,
    },
    "360m-t64": {"model": "SmolLM2-360M", "num_train_samples": 2, "num_generations": 4, "max_new_tokens": 64},
    "360m-t64-lora-ckpt": {
        "model": "SmolLM2-360M", "num_train_samples": 2, "num_generations": 4, "max_new_tokens": 64, "lora_r": 16,
        "gradient_checkpointing": True,
    },
    "qwen2.5-0.5b-t32": {"model": "Qwen2.5-0.5B", "num_train_samples": 2, "num_generations": 4, "max_new_tokens": 32},
    "qwen2.5-0.5b-t32-lora": {
        "model": "Qwen2.5-0.5B", "num_train_samples": 2, "num_generations": 4, "max_new_tokens": 32, "lora_r": 16,
    },
    "qwen3-0.6b-t32": {"model": "Qwen3-0.6B", "num_train_samples": 2, "num_generations": 4, "max_new_tokens": 32},
    "qwen2.5-1.5b-t32-lora": {
        "model": "Qwen2.5-1.5B", "num_train_samples": 1, "num_generations": 4, "max_new_tokens": 32, "lora_r": 16,
    },
    # Held out: run after the CPU allocator's constants (memory.CPU_HEAP_*) were fitted to the cases above.
    "135m-t96-mb4": {
        "model": "SmolLM2-135M", "num_train_samples": 4, "num_generations": 4, "max_new_tokens": 96,
        "micro_batch_size": 4,
    },
    "360m-t64-ckpt": {
        "model": "SmolLM2-360M", "num_train_samples": 2, "num_generations": 4, "max_new_tokens": 64,
        "gradient_checkpointing": True,
    },
    "360m-t48-lora": {
        "model": "SmolLM2-360M", "num_train_samples": 2, "num_generations": 4, "max_new_tokens": 48, "lora_r": 16,
    },
    "qwen3-0.6b-t32-lora-ckpt": {
        "model": "Qwen3-0.6B", "num_train_samples": 2, "num_generations": 4, "max_new_tokens": 32, "lora_r": 16,
        "gradient_checkpointing": True,
    },
    "llama-3.2-1b-t24-lora": {
        "model": "Llama-3.2-1B", "num_train_samples": 1, "num_generations": 4, "max_new_tokens": 24, "lora_r": 16,
    },
}  # fmt: skip
DEFAULT_CASES = tuple(CASES)
HELD_OUT = ("135m-t96-mb4", "360m-t64-ckpt", "360m-t48-lora", "qwen3-0.6b-t32-lora-ckpt", "llama-3.2-1b-t24-lora")
ROUNDS = 2


def rss_peak_bytes() -> int:
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def _malloc_trim() -> None:
    """glibc's malloc_trim(0): give the freed heap memory back to the system (BENCH_MALLOC_TRIM=1, an experiment)."""
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)


def case_settings(case: dict[str, Any], prompt_tokens: int) -> memory.Settings:
    """The estimator's settings for a case, fp32 on the CPU (WEIGHT_DTYPE and PRECISION auto resolve so there)."""
    fields = {f.name for f in dataclasses.fields(memory.Settings)}
    given = {k: v for k, v in case.items() if k in fields}
    return memory.Settings(prompt_tokens=prompt_tokens, device_type="cpu", **given)


def run_case(name: str) -> dict[str, Any]:
    """In this (fresh) process: the baseline, then two rounds of generate + step; what was measured."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from bench.models import DEFAULT_CACHE
    from swarm_gdrive.training import adapters, grpo
    from swarm_gdrive.training.models import resolve_model
    from swarm_gdrive.training.policy import PolicyTrainer, TrainGroup, TrainSettings
    from swarm_gdrive.training.rewards import ANSWER_OPEN
    from swarm_gdrive.training.tasks import build_messages

    case = CASES[name]
    source = resolve_model("SmolLM2-135M-Instruct", DEFAULT_CACHE).source
    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.padding_side = "left"
    baseline = rss_peak_bytes()
    started = time.monotonic()
    torch.manual_seed(0)
    if case["model"] == "packaged":
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, use_safetensors=True)
        arch = memory.KNOWN["SmolLM2-135M"]
    else:
        arch = memory.KNOWN[case["model"]]
        config = AutoConfig.for_model(arch.model_type, **arch.config_dict())
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    if case.get("gradient_checkpointing"):
        adapters.enable_gradient_checkpointing(model)
    if case.get("lora_r"):
        model = adapters.apply_lora(model, adapters.LoraSettings(r=case["lora_r"]))
    load_s = time.monotonic() - started
    after_load = rss_peak_bytes()
    settings = TrainSettings(
        max_new_tokens=case["max_new_tokens"],
        micro_batch_size=case.get("micro_batch_size", 8),
        gen_batch_size=case.get("gen_batch_size", 64),
        learning_rate=1e-6,
        temperature=0.7,
        loss=grpo.LossConfig(beta=case.get("beta", 0.0)),
    )
    reference = None
    if case.get("beta") and not case.get("lora_r"):
        reference = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32).eval().requires_grad_(False)
    trainer = PolicyTrainer(model, tokenizer, settings, torch.device("cpu"), reference)
    prefix = ANSWER_OPEN if case.get("answer_prefix") else ""
    questions = [f"What is {a} + {b}?" for a, b in [(3, 4), (12, 9), (7, 15), (21, 8), (5, 5), (30, 12)]]
    prompts = [trainer.prompt_ids(build_messages(q), prefix) for q in questions[: case["num_train_samples"]]]
    g, j = case["num_generations"], case.get("num_transplant_trees", 0)
    rounds = []
    trim = _malloc_trim if os.environ.get("BENCH_MALLOC_TRIM") == "1" else (lambda: None)
    for round_ in range(ROUNDS):
        gen = trainer.generate(prompts, g, seed=round_)
        trim()
        rewards = [float(i % 2) for i in range(g)]
        groups = [TrainGroup(p, c, rewards) for p, c in zip(prompts, gen.token_ids, strict=True)]
        groups += [TrainGroup(groups[k].prompt_ids, groups[k].completion_ids, rewards[::-1]) for k in range(j)]
        metrics = trainer.step(groups)
        trim()
        longest = max(len(c) for grp in gen.token_ids for c in grp)
        rounds.append({"generate_s": gen.seconds, "step_s": metrics["train/step_s"], "new_tokens": gen.new_tokens,
                       "longest_completion": longest, "active": metrics["train/active_sequences"]})  # fmt: skip
    peak = rss_peak_bytes()
    return {
        "case": name,
        "settings": case,
        "prompt_tokens": max(len(p) for p in prompts),
        "baseline_bytes": baseline,
        "after_load_bytes": after_load,
        "peak_bytes": peak,
        "load_s": load_s,
        "rounds": rounds,
        "threads": torch.get_num_threads(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }


def compare(measured: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """The estimate for what the case ran, beside what it measured. With MALLOC_MMAP_THRESHOLD_ set, glibc returns
    freed blocks at once: the estimate is then compared without its allocator part (the live tensors alone)."""
    case = measured["settings"]
    arch = memory.KNOWN["SmolLM2-135M" if case["model"] == "packaged" else case["model"]]
    est = memory.estimate(arch, case_settings(case, measured["prompt_tokens"]))
    above = measured["peak_bytes"] - measured["baseline_bytes"]
    predicted = est.peak - est.overhead - (est.allocator if "MALLOC_MMAP_THRESHOLD_" in env else 0)
    last = measured["rounds"][-1]
    return {
        **measured,
        "estimate": memory.as_dict(est),
        "measured_above_baseline_bytes": above,
        "estimated_above_baseline_bytes": predicted,
        "error": predicted / above - 1,
        "round_s": last["generate_s"] + last["step_s"],
    }


def rescore(files: list[Path], tag: str, out_dir: Path | None) -> int:
    """The measured rows of earlier runs against the current estimate (the measurement does not depend on it)."""
    runs = [json.loads(f.read_text()) for f in files]
    keep = ("case", "settings", "prompt_tokens", "baseline_bytes", "after_load_bytes", "peak_bytes", "load_s",
            "rounds", "threads", "parameters", "trainable", "env")  # fmt: skip
    rows = [
        {**compare({k: r[k] for k in keep if k in r}, r.get("env", {})), "env": r.get("env", {})}
        for run in runs
        for r in run["rows"]
    ]
    machine = {**runs[0]["machine"], "rescored_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    result = {"machine": machine, "threads": rows[0]["threads"], "rows": rows, "measured_in": [str(f) for f in files]}
    write_result("memory", tag, result, render(result), out_dir)
    return 0


def spawn(name: str, env_vars: dict[str, str]) -> dict[str, Any]:
    env = {**os.environ, **env_vars}
    out = subprocess.run(
        [sys.executable, "-m", "bench.memory_check", "--one", name],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"case {name} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def render(result: dict[str, Any]) -> str:
    mib = 2**20
    rows = []
    for r in result["rows"]:
        s, e = r["settings"], r["estimate"]
        what = (
            f"I={s['num_train_samples']} G={s['num_generations']} J={s.get('num_transplant_trees', 0)} "
            f"T={s['max_new_tokens']} P={r['prompt_tokens']} mb={s.get('micro_batch_size', 8)}"
            + (f" LoRA r={s['lora_r']}" if s.get("lora_r") else "")
            + (" ckpt" if s.get("gradient_checkpointing") else "")
            + (f" beta={s['beta']}" if s.get("beta") else "")
        )
        model = "packaged SmolLM2-135M" if s["model"] == "packaged" else f"{s['model']} (random)"
        rows.append([
            r["case"] + (" (held out)" if r["case"] in HELD_OUT else ""), model, what,
            round(r["baseline_bytes"] / mib), round(r["measured_above_baseline_bytes"] / mib),
            round(r["estimated_above_baseline_bytes"] / mib), f"{100 * r['error']:+.0f} %", e["dominant"],
            r["rounds"][-1]["generate_s"], r["rounds"][-1]["step_s"],
        ])  # fmt: skip
    errors = [abs(r["error"]) for r in result["rows"]]
    envs = sorted({" ".join(f"{k}={v}" for k, v in r.get("env", {}).items()) for r in result["rows"]} - {""})
    return "\n\n".join(
        [
            "# Memory estimate against measured peaks (CPU)",
            machine_line(result["machine"]),
            "Each case is a fresh process; baseline = resident-set high-water mark after importing torch, "
            "transformers and the trainer and loading a tokenizer; measured = high-water mark after two rounds of "
            "generate + step, minus the baseline; estimate = `memory.estimate` minus its runtime overhead, for the "
            "case's prompt length P and T = MAX_NEW_TOKENS completion tokens. fp32 weights and compute (the CPU's "
            f"auto), {result['threads']} threads. Times are the second round's. The allocator constants of the "
            "estimate were fitted to the cases not marked held out; the held-out ones ran after."
            + (
                f" Process environment: {'; '.join(envs)}; the estimate is compared without its allocator part."
                if envs
                else " glibc's default malloc settings."
            ),
            markdown_table(
                [
                    "case",
                    "model",
                    "settings",
                    "baseline MiB",
                    "measured MiB",
                    "estimate MiB",
                    "error",
                    "peak set by",
                    "generate s",
                    "update s",
                ],
                rows,
            ),  # fmt: skip
            f"Largest error {100 * max(errors):.0f} %, mean absolute error "
            f"{100 * sum(errors) / len(errors):.0f} % over {len(errors)} cases."
            if errors
            else "No case ran.",
        ]
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES), help=f"comma list of {', '.join(CASES)}")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="VAR=VALUE",
        help="a variable for each case's process, e.g. OMP_NUM_THREADS=1 or MALLOC_MMAP_THRESHOLD_=65536 (glibc: "
        "allocations that large are mmap'ed and returned when freed); repeatable",
    )
    parser.add_argument("--tag", default=None, help="result file tag (default cpu-<cores>c-<date>)")
    parser.add_argument("--out-dir", type=Path, default=None, help="default bench/results")
    parser.add_argument(
        "--rescore",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="measure nothing: compare the rows of these result files with the current estimate, write them as one",
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: run this case, print its JSON
    args = parser.parse_args(argv)
    if any("=" not in item for item in args.env):
        parser.error("--env takes VAR=VALUE")
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose among {', '.join(CASES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one:
        print(json.dumps(run_case(args.one)))
        return 0
    tag = args.tag or f"{machine_tag()}-{time.strftime('%Y-%m-%d')}"
    if args.rescore:
        return rescore(args.rescore, tag, args.out_dir)
    source = source_version()
    env_vars = dict(item.split("=", 1) for item in args.env)
    rows = []
    for name in args.cases.split(","):
        started = time.monotonic()
        row = {**compare(spawn(name, env_vars), env_vars), "env": env_vars}
        rows.append(row)
        print(
            f"{name}: measured {row['measured_above_baseline_bytes'] / 2**20:.0f} MiB above a "
            f"{row['baseline_bytes'] / 2**20:.0f} MiB baseline, estimated "
            f"{row['estimated_above_baseline_bytes'] / 2**20:.0f} MiB ({100 * row['error']:+.0f} %); round "
            f"{row['round_s']:.1f} s; {time.monotonic() - started:.0f} s",
            file=sys.stderr,
            flush=True,
        )
        result = {"machine": machine_info("cpu", source), "threads": rows[0]["threads"], "rows": rows}
        write_result("memory", tag, result, render(result), args.out_dir)  # rewritten after each case
    return 0


if __name__ == "__main__":
    sys.exit(main())
