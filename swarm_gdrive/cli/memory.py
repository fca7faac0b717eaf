"""``swarm-gdrive memory``: the memory one worker needs for the model and the training settings in the environment,
part by part, with the settings that would fit when it does not."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from typing import Any


def add_memory_parser(sub: Any) -> None:
    from swarm_gdrive.training.hardware import DEVICES

    mem = sub.add_parser(
        "memory",
        help="the memory one worker needs for MODEL_NAME and the settings in the environment, part by part",
        description="Estimates a worker's peak memory (weights, gradients, AdamW, activations, generation) from "
        "the model's architecture and the training settings in the environment (MODEL_NAME, NUM_TRAIN_SAMPLES, "
        "NUM_GENERATIONS, MAX_NEW_TOKENS, MICRO_BATCH_SIZE, GEN_BATCH_SIZE, LORA_R, WEIGHT_DTYPE, PRECISION, "
        "GRADIENT_CHECKPOINTING, BETA, ...); docs/hardware.md explains the model and its measured error. "
        "Exit 1 when it does not fit the memory given.",
    )
    mem.add_argument("--model", help="MODEL_NAME to estimate instead of the environment's")
    mem.add_argument(
        "--gpu",
        choices=list(DEVICES),
        help="one of the guide's devices (a GPU, Apple silicon or a laptop): its memory, dtypes and speed",
    )
    mem.add_argument("--device", help="cpu, cuda or mps instead of DEVICE (auto: this machine's)")
    mem.add_argument("--device-memory", type=float, metavar="GIB", help="memory available to the worker(s)")
    mem.add_argument(
        "--prompt-tokens", type=int, help="longest prompt in tokens (default 256; the paper's tasks reach 611)"
    )


def memory_main(args: argparse.Namespace) -> int:
    from swarm_gdrive.config import ConfigError, from_env
    from swarm_gdrive.training import hardware, memory

    try:  # the node's settings from the environment; GDRIVE_PATH and the task mix do not matter here
        config = from_env({**os.environ, "GDRIVE_PATH": tempfile.gettempdir(), "NODE_ROLE": "coordinator"})
        arch = memory.architecture_for(args.model or config.model_name, config.huggingface_access_token)
        device = _memory_device(args, config.device)
        settings = hardware.settings_for(config, device, args.prompt_tokens)
        est = memory.estimate(arch, settings)
    except (ConfigError, memory.UnknownModelError, ValueError) as exc:
        print(f"swarm-gdrive memory: error: {exc}", file=sys.stderr)
        return 2
    s = settings
    kind = f"LoRA r={s.lora_r} ({s.lora_target_modules})" if s.lora else "full fine-tune"
    print(f"{arch.name}: {est.parameters / 1e6:.1f}M parameters, {kind}, WEIGHT_DTYPE {s.weight_dtype}, autocast "
          f"{s.precision}, on {device.name}")  # fmt: skip
    print(
        f"I={s.num_train_samples} G={s.num_generations} J={s.num_transplant_trees} MAX_NEW_TOKENS={s.max_new_tokens} "
        f"prompt={s.prompt_tokens} tokens (--prompt-tokens) MICRO_BATCH_SIZE={s.micro_batch_size} "
        f"GEN_BATCH_SIZE={s.gen_batch_size} GRADIENT_CHECKPOINTING={str(s.gradient_checkpointing).lower()} "
        f"BETA={s.beta:g}\n"
    )
    print(memory.breakdown(est))
    timing = hardware.round_time(arch, s, device)
    if timing is not None:
        print(f"\nround time (estimate, docs/hardware.md): generate {timing.generate_s:.1f} s + update "
              f"{timing.update_s:.1f} s")  # fmt: skip
    if not device.memory_gib:
        print("\nsay how much memory the device has with --device-memory GiB (or --gpu) for a verdict")
        return 0
    room = device.memory_bytes
    if est.fits(room):
        print(f"\nfits in {device.memory_gib:g} GiB: {memory.workers_that_fit(est, room)} such worker(s) side by side")
        return 0
    print(f"\ndoes not fit in {device.memory_gib:g} GiB (needs {est.peak / memory.GIB:.1f} GiB); these would fit:")
    for change, fitting in hardware.suggestions(arch, s, room):
        print(f"  {change:<72} {fitting.peak / memory.GIB:6.2f} GiB")
    return 1


def _memory_device(args: argparse.Namespace, configured: str) -> Any:
    """The device to estimate for: a guide device (--gpu), else --device/DEVICE with --device-memory."""
    from swarm_gdrive.training import hardware

    if args.gpu:
        device = hardware.DEVICES[args.gpu]
        return device if args.device_memory is None else dataclasses.replace(device, memory_gib=args.device_memory)
    kind = args.device or configured
    native = True
    if kind == "auto" or kind.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            native = torch.cuda.get_device_capability() >= (8, 0)
            kind = "cuda"
        elif kind == "auto":
            kind = "mps" if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available() else "cpu"
    kind = "cuda" if kind.startswith("cuda") else kind
    name = {"cuda": "a CUDA GPU" + ("" if native else " without bf16"), "mps": "Apple silicon (mps)"}.get(kind, "CPU")
    return hardware.Device(kind, name, args.device_memory or 0.0, kind, native and kind == "cuda", 0, 0, 0, "")
