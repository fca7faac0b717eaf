"""Devices a worker may run on, which settings fit there (:mod:`.memory`), and the round time to expect.

The round time here is an **estimate** from a stated model, for devices this project could not measure:

- a decode step of ``generate`` takes ``L x (1.22 + 0.0245 (n - 1))`` ms for ``L`` layers and ``n``
  sequences, or the time to read the weights and KV cache at the device's memory bandwidth, or the
  step's ``2 N n`` FLOPs at its peak x :data:`UTILISATION`, whichever is longest. The per-layer constants
  are the two generation rates measured on an H200 (SmolLM2-135M's architecture: 27.4 tokens/s for one
  sequence, 769 for 64; bench/results/h200_trainer_speed.json): at these sizes the step is bound by
  Python and kernel launches on the host, not by the GPU, so they are taken as they are for every GPU;
- the prefill of each ``generate`` call: ``2 N n P`` FLOPs at peak x utilisation;
- a training micro-batch: ``L x 8.4`` ms (the same H200's update of 64 sequences in 4 micro-batches
  of 16: 1.01 s) or its FLOPs at peak x utilisation, whichever is longer; FLOPs are ``6 N`` per token
  for a full fine-tune, ``4 N`` under LoRA (no weight gradients for the base), plus ``2 N`` with
  gradient checkpointing (the forward again), the LM head counted on completion tokens only;
- peaks are the vendors' dense figures (:data:`DEVICES`): the 16-bit tensor-core peak under a bf16/fp16
  autocast or 16-bit weights, the float32 peak otherwise (PyTorch does not use TF32 for matmuls unless
  asked). Apple silicon's per-layer overheads are assumed twice CUDA's (not measured).

Not counted: evaluation rounds, rescoring peers' groups, the shared folder's latency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from swarm_gdrive.training.memory import GIB, Architecture, Estimate, Settings, estimate

#: Sustained share of a device's peak FLOPs a training or prefill pass reaches (an assumption: HF eager
#: PyTorch at small batch typically reaches 20-50 %).
UTILISATION = 0.35
#: ms per layer per decode step for one sequence, and its growth per extra sequence (H200, see the docstring).
DECODE_MS_PER_LAYER = 1.22
DECODE_MS_PER_LAYER_PER_SEQUENCE = 0.0245
#: ms per layer per training micro-batch, forward and backward (H200: 1.01 s / 4 micro-batches / 30 layers).
TRAIN_MS_PER_LAYER = 8.4
MPS_OVERHEAD_FACTOR = 2.0


@dataclass(frozen=True)
class Device:
    """A device as the guide treats it: memory one worker may use, and the public specs of the speed model."""

    key: str
    name: str
    memory_gib: float  # what a worker may use: the GPU's total, or a share of a machine's RAM
    device_type: str  # cuda | mps | cpu
    native_bf16: bool
    bandwidth_gbs: float
    fp32_tflops: float
    tensor16_tflops: float  # dense bf16 (or fp16 where there is no bf16) tensor-core peak
    source: str

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB


_NVIDIA = "NVIDIA's datasheet"
#: The guide's devices (docs/hardware.md). GPU memory is the card's total as nvidia-smi reports it, about;
#: Apple silicon's GPU may use about 2/3 of the unified memory (macOS's working-set limit, approximate); a laptop's
#: CPU process about 10 GiB of 16 GB with the system and a browser open.
DEVICES: dict[str, Device] = {
    d.key: d
    for d in (
        Device("T4", "NVIDIA T4 (Colab's free GPU)", 15.0, "cuda", False, 320, 8.1, 65, f"{_NVIDIA}: 16 GB GDDR6"),
        Device("L4", "NVIDIA L4", 22.5, "cuda", True, 300, 30.3, 121, f"{_NVIDIA}: 24 GB GDDR6"),
        Device("A100-40GB", "NVIDIA A100 40GB", 40.0, "cuda", True, 1555, 19.5, 312, f"{_NVIDIA}: HBM2"),
        Device("A100-80GB", "NVIDIA A100 80GB", 80.0, "cuda", True, 2039, 19.5, 312, f"{_NVIDIA}: HBM2e, SXM"),
        Device("M2-16GB", "Apple M2, 16 GB (mps)", 10.7, "mps", False, 100, 3.6, 3.6,
               "Apple: M2, 100 GB/s, GPU 3.6 TFLOPS"),
        Device("M-Pro-32GB", "Apple M-series Pro, 32 GB (mps)", 21.3, "mps", False, 200, 6.8, 6.8,
               "Apple: M2 Pro, 200 GB/s, GPU 6.8 TFLOPS"),
        Device("laptop-16GB", "laptop CPU, 16 GB RAM", 10.0, "cpu", False, 50, 0.5, 0.5, "typical; not modelled"),
    )
}  # fmt: skip


@dataclass(frozen=True)
class RoundTime:
    """Estimated seconds of one round's generation and update on a device (see the module docstring)."""

    generate_s: float
    update_s: float

    @property
    def total_s(self) -> float:
        return self.generate_s + self.update_s


def _peak_flops(device: Device, s: Settings) -> float:
    sixteen = s.precision != "fp32" or s.weight_dtype != "fp32"
    return (device.tensor16_tflops if sixteen else device.fp32_tflops) * 1e12 * UTILISATION


def round_time(arch: Architecture, s: Settings, device: Device) -> RoundTime | None:
    """The estimated generate + update time of one round on a GPU or Apple silicon; None on a CPU (measure it)."""
    if device.device_type == "cpu":
        return None
    factor = MPS_OVERHEAD_FACTOR if device.device_type == "mps" else 1.0
    layers, n_params = arch.num_hidden_layers, arch.parameters()
    head = arch.vocab_size * arch.hidden_size
    body = n_params - head
    flops = _peak_flops(device, s)
    wbytes = n_params * (2 if s.weight_dtype != "fp32" or s.precision != "fp32" else 4)
    # generation: calls of n sequences, each a prefill and T decode steps
    n = s.train_gen_sequences
    calls = math.ceil(s.num_train_samples * s.num_generations / n)
    kv_per_token = 2 * layers * arch.kv_dim * 2
    generate = 0.0
    for _ in range(calls):
        generate += 2 * body * n * s.prompt_tokens / flops
        for t in range(0, s.max_new_tokens, 8):  # 8-step blocks: the KV cache grows as it goes
            launch = layers * (DECODE_MS_PER_LAYER + DECODE_MS_PER_LAYER_PER_SEQUENCE * (n - 1)) / 1e3 * factor
            memory_bound = (wbytes + kv_per_token * n * (s.prompt_tokens + t)) / (device.bandwidth_gbs * 1e9)
            generate += 8 * max(launch, memory_bound, 2 * n_params * n / flops)
    # update: micro-batches of forward + backward
    micro = math.ceil(s.train_sequences / s.micro_batch)
    per_token = (4 if s.lora else 6) + (2 if s.gradient_checkpointing else 0)
    update = 0.0
    for i in range(micro):
        b = min(s.micro_batch, s.train_sequences - i * s.micro_batch)
        work = per_token * body * b * (s.prompt_tokens + s.max_new_tokens) + 6 * head * b * s.max_new_tokens
        update += max(layers * TRAIN_MS_PER_LAYER / 1e3 * factor, work / flops)
    return RoundTime(generate, update)


def recommend(arch: Architecture, base: Settings, device: Device) -> tuple[Settings, Estimate] | None:
    """The fastest settings of ``base``'s kind that fit ``device``, or None.

    Tried in order: MICRO_BATCH_SIZE 8, 4, 2, 1 without gradient checkpointing, then 8, 4, 2, 1 with it, each
    with GEN_BATCH_SIZE 64, 32, 16, 8 (the largest that fits); the first that fits wins."""
    for checkpointing in (False, True):
        for micro in (8, 4, 2, 1):
            for gen in (64, 32, 16, 8):
                s = replace(
                    base,
                    micro_batch_size=micro,
                    gen_batch_size=gen,
                    gradient_checkpointing=checkpointing,
                    device_type=device.device_type,
                )
                est = estimate(arch, s)
                if est.fits(device.memory_bytes):
                    return s, est
    return None


def settings_for(config: object, device: Device, prompt_tokens: int | None = None) -> Settings:
    """A node's settings (a :class:`swarm_gdrive.config.Config`) as they resolve on ``device`` (WEIGHT_DTYPE and
    PRECISION auto depend on it)."""
    from swarm_gdrive.training.memory import settings_from

    return settings_from(config, device.device_type, device.native_bf16, prompt_tokens)


def _lora_of(s: Settings) -> Settings:
    """``s`` with LORA_R=16, WEIGHT_DTYPE and PRECISION as auto resolves them then (memory.auto_weight_dtype)."""
    if s.device_type != "cuda":
        return replace(s, lora_r=16)
    half = "bf16" if s.precision == "bf16" else "fp16"
    return replace(s, lora_r=16, weight_dtype=half, precision=half)


_VARIABLES = {
    "micro_batch_size": "MICRO_BATCH_SIZE",
    "gen_batch_size": "GEN_BATCH_SIZE",
    "gradient_checkpointing": "GRADIENT_CHECKPOINTING",
    "lora_r": "LORA_R",
    "weight_dtype": "WEIGHT_DTYPE",
    "max_new_tokens": "MAX_NEW_TOKENS",
}


def changes(base: Settings, new: Settings) -> str:
    """The environment variables to set to go from ``base`` to ``new``, as ``VAR=value`` words."""
    words = []
    for name, var in _VARIABLES.items():
        value = getattr(new, name)
        if value != getattr(base, name):
            words.append(f"{var}={str(value).lower() if isinstance(value, bool) else value}")
    return " ".join(words)


def suggestions(arch: Architecture, s: Settings, device_bytes: float) -> list[tuple[str, Estimate]]:
    """Ways to make ``s`` fit in ``device_bytes``: single changes that suffice, cheapest in speed first; when none
    does, the fastest combination of a full fine-tune's and of LoRA's (:func:`recommend`). Each as the variables
    to set and the estimate it gives."""
    tries: list[Settings] = []
    if not s.gradient_checkpointing:
        tries.append(replace(s, gradient_checkpointing=True))
    tries += [replace(s, micro_batch_size=m) for m in (4, 2, 1) if m < s.micro_batch_size]
    tries += [replace(s, gen_batch_size=g) for g in (32, 16, 8) if g < s.gen_batch_size]
    if not s.lora:
        tries.append(_lora_of(s))
    if s.max_new_tokens > 64:
        tries.append(replace(s, max_new_tokens=s.max_new_tokens // 2))
    found = [(changes(s, t), est) for t in tries if (est := estimate(arch, t)).fits(device_bytes)]
    if found:
        return found
    room = Device("custom", "", device_bytes / GIB, s.device_type, s.precision == "bf16", 0, 0, 0, "")
    for base in (s, _lora_of(s)) if not s.lora else (s,):
        plan = recommend(arch, base, room)
        if plan is not None:
            found.append((changes(s, plan[0]), plan[1]))
    return found
