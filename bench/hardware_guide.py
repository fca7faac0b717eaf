"""The tables and the figure of docs/hardware.md, from the memory estimate and the round-time model.

For every device of ``training.hardware.DEVICES`` and every architecture of ``training.memory.KNOWN``, three
ways to train: a full fine-tune with float32 weights (PRECISION auto: bf16 autocast where native), a full
fine-tune with bf16 weights (only where bf16 is native), and LoRA r = 16 on all linear layers (WEIGHT_DTYPE
auto: fp16 on a T4, bf16 on an L4/A100, fp32 on a CPU and mps). Each cell is the fastest setting that fits
(``hardware.recommend``: MICRO_BATCH_SIZE 8 down to 1, then the same with gradient checkpointing, GEN_BATCH_SIZE
64 down to 8), its estimated peak and its estimated round time. Everything here is an **estimate**; what was
measured is in bench/results/memory_*.md (``python -m bench memory``).

``python -m bench.hardware_guide [--workload default|small] [--plot docs/images/memory.png]`` prints Markdown.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from swarm_gdrive import presets
from swarm_gdrive.training import hardware, memory
from swarm_gdrive.training.memory import GIB, KNOWN, Settings

#: The package's defaults (config.py): I = 8, G = 8, J = 0, MAX_NEW_TOKENS 256, held-out evaluation of 16
#: questions of each of the paper's nine tasks; prompts of 256 tokens (the paper's tasks: 163 at the median).
DEFAULT_WORKLOAD = Settings(
    num_train_samples=8, num_generations=8, max_new_tokens=256, prompt_tokens=256, eval_prompts=16 * 9
)
_SMALL = presets.load("small-model")
#: The small-model preset (the demo and the notebooks' small-model settings) with the demo's J = 1; prompts of 121
#: tokens (the longest of chain_sum and basic_arithmetic at their easiest, with the answer prefix).
SMALL_WORKLOAD = Settings(
    num_train_samples=int(_SMALL["NUM_TRAIN_SAMPLES"]),
    num_generations=int(_SMALL["NUM_GENERATIONS"]),
    num_transplant_trees=1,
    max_new_tokens=int(_SMALL["MAX_NEW_TOKENS"]),
    prompt_tokens=121,
    eval_prompts=int(_SMALL["EVAL_SAMPLES"]) * 2,
)
WORKLOADS = {"default": DEFAULT_WORKLOAD, "small": SMALL_WORKLOAD}
MODES = ("full fp32", "full bf16", "LoRA r=16")


def mode_settings(base: Settings, mode: str, device: hardware.Device) -> Settings | None:
    """``base`` trained one of :data:`MODES` way on ``device``, dtypes as auto resolves them; None where refused."""
    lora = mode.startswith("LoRA")
    if mode == "full bf16" and not device.native_bf16:
        return None  # refused on a T4; on a CPU or mps it runs, slowly, and is not what auto picks
    requested = "bf16" if mode == "full bf16" else "auto"
    weights = memory.auto_weight_dtype(requested, lora, device.device_type, device.native_bf16)
    precision = memory.auto_precision("auto", weights, device.device_type, device.native_bf16)
    return dataclasses.replace(
        base, lora_r=16 if lora else 0, weight_dtype=weights, precision=precision, device_type=device.device_type
    )


def cell(arch: memory.Architecture, base: Settings, mode: str, device: hardware.Device) -> str:
    """One table cell: the fastest fitting settings, their peak, the round time (all estimated)."""
    settings = mode_settings(base, mode, device)
    if settings is None:
        return "refused (no native bf16)" if device.device_type == "cuda" else "n/a"
    plan = hardware.recommend(arch, settings, device)
    if plan is None:
        least = memory.estimate(
            arch, dataclasses.replace(settings, micro_batch_size=1, gen_batch_size=8, gradient_checkpointing=True)
        )
        return f"no ({least.peak / GIB:.1f} GiB at least)"
    chosen, est = plan
    how = f"mb {chosen.micro_batch_size}" + (" + ckpt" if chosen.gradient_checkpointing else "")
    if chosen.gen_batch_size < base.gen_batch_size:
        how += f", gen {chosen.gen_batch_size}"
    timing = hardware.round_time(arch, chosen, device)
    when = f", ~{_seconds(timing.total_s)}" if timing is not None else ""
    return f"yes: {how}; {est.peak / GIB:.1f} GiB{when}"


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"


def device_table(device: hardware.Device, base: Settings) -> str:
    header = ["model (parameters)", *MODES]
    rows = [[f"{name} ({arch.parameters() / 1e6:,.0f}M)", *(cell(arch, base, m, device) for m in MODES)]
            for name, arch in KNOWN.items()]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def guide(base: Settings) -> str:
    parts = []
    for device in hardware.DEVICES.values():
        parts.append(f"### {device.name}: {device.memory_gib:g} GiB for the worker (estimated)\n")
        parts.append(device_table(device, base) + "\n")
    return "\n".join(parts)


def plot(path: Path, base: Settings) -> None:
    """Estimated peak memory of each architecture, per way of training, with the GPUs' memory as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    archs = sorted(KNOWN.values(), key=lambda a: a.parameters())
    ways = {
        "full fine-tune, fp32 weights, bf16 autocast, mb 8": dict(precision="bf16"),
        "full, fp32 weights, bf16 autocast, mb 1 + checkpointing": dict(
            precision="bf16", micro_batch_size=1, gradient_checkpointing=True
        ),
        "LoRA r=16, bf16 weights, mb 8": dict(precision="bf16", weight_dtype="bf16", lora_r=16),
        "LoRA r=16, bf16 weights, mb 1 + checkpointing": dict(
            precision="bf16", weight_dtype="bf16", lora_r=16, micro_batch_size=1, gradient_checkpointing=True
        ),
    }
    fig, ax = plt.subplots(figsize=(8.5, 7))
    height = 0.8 / len(ways)
    for k, (label, change) in enumerate(ways.items()):
        s = dataclasses.replace(base, device_type="cuda", **change)
        peaks = [memory.estimate(a, s).peak / GIB for a in archs]
        ax.barh([i + (k - 1.5) * height for i in range(len(archs))], peaks, height=height, label=label)
    for key in ("T4", "L4", "A100-40GB", "A100-80GB"):
        d = hardware.DEVICES[key]
        ax.axvline(d.memory_gib, color="black", linestyle=":", linewidth=1)
        ax.text(d.memory_gib, -0.75, f"{key} ", rotation=90, va="top", ha="right", fontsize=8)
    ax.set_yticks(range(len(archs)), [f"{a.name} ({a.parameters() / 1e9:.2f}B)" for a in archs])
    ax.set_xscale("log")
    ax.set_xlabel("estimated peak memory of one worker on a CUDA GPU (GiB, log scale)")
    ax.set_title(
        f"I={base.num_train_samples} G={base.num_generations}, prompt {base.prompt_tokens} + {base.max_new_tokens} "
        "tokens, GEN_BATCH_SIZE 64: estimates (docs/hardware.md)",
        fontsize=10,
    )
    ax.set_ylim(-1.6, len(archs) - 0.5)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hardware_guide", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=list(WORKLOADS), default="default")
    parser.add_argument("--plot", type=Path, help="also write the figure here (PNG)")
    args = parser.parse_args(argv)
    base = WORKLOADS[args.workload]
    print(guide(base))
    if args.plot:
        plot(args.plot, base)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
