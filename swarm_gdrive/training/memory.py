"""Peak memory of one worker, from its model's architecture and its training settings (issue #18).

A worker keeps, for its whole life, the weights, a frozen reference (a full fine-tune with BETA > 0),
the gradients and AdamW's two moments of what it trains. On top of those, one of three things at a
time: a training micro-batch's activations, a ``generate`` call's KV cache and buffers, or AdamW's
step. So::

    peak = weights + reference + gradients + optimizer
           + max(training activations, generation, optimizer step) + runtime + allocator

**Parameters** are counted per decoder layer from the ``config.json`` fields (embeddings, the q/k/v/o
and gate/up/down projections with their biases, RMSNorms, Qwen3's q/k norms, an untied LM head);
``tests/unit/test_memory_estimate.py`` checks every architecture of :data:`KNOWN` against
``AutoModelForCausalLM.from_config`` on the meta device. LoRA trains ``r * (in + out)`` per targeted
linear (peft's count), in float32 whatever the base's dtype.

**Training activations** of a micro-batch of ``B`` sequences of ``S = P + T`` tokens (``P`` prompt,
``T`` = MAX_NEW_TOKENS completion tokens: the worst case, as micro-batches are padded to their longest):

- per layer and token, what autograd keeps for the backward pass: RMSNorm inputs, the attention's
  queries, repeated keys and values, output and the ``o_proj`` input, the MLP's gate, up, SiLU and
  product (``4 I``), Qwen3's q/k norms; with a padding mask, SDPA also keeps a ``[B, 1, S, S]`` mask
  per layer. The coefficients (:func:`layer_bytes_per_token`) come from counting the tensors
  ``torch.autograd.graph.saved_tensors_hooks`` sees (torch 2.13, transformers 5.24; within 6 % of
  that count on Llama, Qwen2 and Qwen3 layouts). GRADIENT_CHECKPOINTING keeps only each layer's
  input (``h`` floats per token) and recomputes one layer at a time in the backward pass;
- the log-probabilities of the completion tokens (``training.grpo.per_token_logps``): the model's
  logits ``[B, T + 1, V]`` in the forward dtype, and float32 rows ``[T, V]`` kept for
  ``logsumexp``'s backward: ``B T V (a + 4)`` bytes for a forward dtype of ``a`` bytes. With a
  vocabulary of 49k-152k entries this dominates for small models;
- under a 16-bit autocast over float32 weights, the 16-bit copies of the weights (autocast caches
  them for the forward and autograd keeps them for the backward): ``2 N`` bytes;
- the embedding's gradient computed once more before it is added (an untied LM head's too).

**Generation** of ``n`` sequences (``GEN_BATCH_SIZE // G`` prompts x G, at most I prompts) keeps a
KV cache of ``2 L n (P + T) kv_heads head_dim`` values, plus the prefill's largest layer temporaries
over ``n P`` tokens and the sampler's float32 buffers over the vocabulary; under autocast over float32
weights, the 16-bit weight copies again.

**AdamW's step** needs one temporary the size of a parameter on the CPU (torch's single-tensor
implementation) and one the size of all trainable parameters on a GPU (the ``foreach`` one).

**Runtime**: on the CPU, the resident memory of a worker process before its model (torch, transformers,
reasoning-gym, the storage clients: measured); on a GPU the CUDA context (about 0.5 GiB, outside torch's
allocations); on Apple silicon both, as they share the unified memory (not measured).

**Allocator**: what the allocator holds beyond the live tensors. On a GPU, 10 % of the peak for the caching
allocator's fragmentation (an estimate). On the CPU, glibc's malloc keeps much of what a training step frees
(activations, and the gradients ``zero_grad`` drops): ``bench/memory_check.py`` measured 0.2-2.5 GiB above the
live tensors for a full fine-tune and 1.2-2.9 GiB with LoRA (135M to 1.5B parameters), so the estimate adds
``0.4 x (activations + gradients)`` and 2.5 GiB respectively: constants fitted to those runs, not derived.
With ``MALLOC_MMAP_THRESHOLD_=65536`` in a worker's environment the retention is gone (the live-tensor estimate
was then within 3 % of the 6 peaks measured so), for 45-75 % more time per round.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

GIB = 2**30
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
DEVICE_TYPES = ("cpu", "cuda", "mps")

#: Resident memory of a worker process before it loads its model: 0.41 GiB after importing torch, transformers and the
#: trainer with a tokenizer loaded (bench/memory_check.py's baseline), 0.46 GiB with reasoning-gym's tasks, the Drive
#: client and peft too (torch 2.13.0+cpu, transformers 5.24.0, Linux). Other platforms differ by a few hundred MiB.
CPU_PROCESS_BYTES = int(0.5 * GIB)
#: glibc's heap retention on the CPU (see the module docstring): a share of a full fine-tune's activations and
#: gradients; LoRA's, whatever the model.
CPU_HEAP_SHARE = 0.4
CPU_HEAP_LORA = int(2.5 * GIB)
#: The CUDA context and cuBLAS/cuDNN workspaces, outside torch's allocator: about 0.3-0.5 GiB on recent GPUs.
CUDA_CONTEXT_BYTES = int(0.5 * GIB)
#: What the caching allocator holds beyond the live tensors (fragmentation), as a share of the peak.
CUDA_ALLOCATOR_SLACK = 0.10
#: Metal's context on Apple silicon: not measured here; taken as the CUDA one.
MPS_CONTEXT_BYTES = int(0.5 * GIB)
#: Prompt length assumed when none is given: the paper's nine tasks give 163 tokens at the median and up to 611
#: with SmolLM2's chat template and reasoning-gym's system prompt; the small-model preset's two tasks 113-121.
DEFAULT_PROMPT_TOKENS = 256

#: The decoder layer's linear modules, as named in transformers' Llama, Qwen2 and Qwen3 (peft's targets).
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class UnknownModelError(ValueError):
    """A model whose architecture is neither in :data:`KNOWN` nor readable from a config.json."""


@dataclass(frozen=True)
class Architecture:
    """The fields of a decoder-only model's ``config.json`` that set its size (Llama, Qwen2, Qwen3 layouts)."""

    name: str
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    qkv_bias: bool = False  # Qwen2: biases on q, k and v (not o)
    o_bias: bool = False  # Llama's attention_bias: on q, k, v and o
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: an RMSNorm over head_dim on queries and keys
    source: str = ""

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def linears(self) -> dict[str, tuple[int, int]]:
        """Each decoder layer's linear modules: name -> (in_features, out_features)."""
        h, i = self.hidden_size, self.intermediate_size
        return {
            "q_proj": (h, self.q_dim),
            "k_proj": (h, self.kv_dim),
            "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def layer_parameters(self) -> int:
        """Parameters of one decoder layer: weights, biases, norms."""
        weights = sum(a * b for a, b in self.linears().values())
        biases = (self.q_dim + 2 * self.kv_dim) * (self.qkv_bias or self.o_bias) + self.hidden_size * self.o_bias
        biases += (2 * self.intermediate_size + self.hidden_size) * self.mlp_bias
        norms = 2 * self.hidden_size + 2 * self.head_dim * self.qk_norm
        return weights + biases + norms

    def parameters(self) -> int:
        """All parameters, as ``sum(p.numel() for p in model.parameters())`` counts them (a tied head once)."""
        embedding = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embedding
        return embedding + head + self.num_hidden_layers * self.layer_parameters() + self.hidden_size

    def lora_parameters(self, r: int, target_modules: str) -> int:
        """Trainable parameters of LoRA rank ``r``: ``r * (in + out)`` per targeted linear of every layer."""
        return r * sum(a + b for a, b in self.targeted(target_modules).values()) * self.num_hidden_layers

    def targeted(self, target_modules: str) -> dict[str, tuple[int, int]]:
        """The linears LORA_TARGET_MODULES names: all-linear (every one but the LM head, as peft) or a list."""
        linears = self.linears()
        if target_modules == "all-linear":
            return linears
        names = [n.strip() for n in target_modules.split(",") if n.strip()]
        unknown = [n for n in names if n.rsplit(".", 1)[-1] not in linears]
        if unknown:
            raise ValueError(
                f"LORA_TARGET_MODULES={target_modules!r}: {', '.join(unknown)} is not a linear layer of "
                f"{self.name}; use all-linear or names among {', '.join(LINEAR_NAMES)}"
            )
        return {n: linears[n] for n in dict.fromkeys(n.rsplit(".", 1)[-1] for n in names)}

    def config_dict(self) -> dict[str, Any]:
        """Keyword arguments of ``transformers.AutoConfig.for_model(model_type, **...)`` for this layout."""
        out = {
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
        }
        if self.model_type != "qwen2":  # Qwen2's biases are fixed by its code, not by its config
            out["attention_bias"] = self.o_bias
        if self.model_type == "llama":
            out["mlp_bias"] = self.mlp_bias
        return out

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | Any, name: str = "", source: str = "") -> Architecture:
        """From a ``config.json`` (a dict) or a transformers ``PretrainedConfig``.

        Layouts other than Llama, Qwen2 and Qwen3 are read as if they were Llama's: their count may be off by
        what they add (the estimate says so in a log line)."""
        get = config.get if isinstance(config, Mapping) else (lambda key, default=None: getattr(config, key, default))
        if get("text_config") is not None:  # a multimodal wrapper: its language model
            return cls.from_config(get("text_config"), name, source)
        model_type = get("model_type") or "llama"
        if model_type not in ("llama", "qwen2", "qwen3"):
            logger.warning("model_type %s is estimated as a Llama layout (not one of llama, qwen2, qwen3)", model_type)
        heads = int(get("num_attention_heads"))
        hidden = int(get("hidden_size"))
        attention_bias = bool(get("attention_bias", False))
        return cls(
            name=name or str(get("_name_or_path") or model_type),
            model_type=model_type,
            hidden_size=hidden,
            intermediate_size=int(get("intermediate_size")),
            num_hidden_layers=int(get("num_hidden_layers")),
            num_attention_heads=heads,
            num_key_value_heads=int(get("num_key_value_heads") or heads),
            head_dim=int(get("head_dim") or hidden // heads),
            vocab_size=int(get("vocab_size")),
            tie_word_embeddings=bool(get("tie_word_embeddings", True)),
            max_position_embeddings=int(get("max_position_embeddings") or 0),
            qkv_bias=model_type == "qwen2" or attention_bias,
            o_bias=model_type != "qwen2" and attention_bias,
            mlp_bias=bool(get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            source=source,
        )


def _arch(name: str, model_type: str, source: str, *dims: int) -> Architecture:
    h, i, layers, heads, kv, head_dim, vocab, positions = dims
    qwen2, qwen3 = model_type == "qwen2", model_type == "qwen3"
    return Architecture(
        name, model_type, h, i, layers, heads, kv, head_dim, vocab, True, positions, qkv_bias=qwen2, qk_norm=qwen3,
        source=source,
    )  # fmt: skip


_LITGPT = "Lightning-AI/litgpt litgpt/config.py (commit 26857050), which cites the repository's config.json"
_MLC = "mlc-ai/mlc-llm python/mlc_llm/model/model_preset.py (commit 79d603f0), a copy of config.json"

#: Architectures typed in from their ``config.json`` (the Hub's, for the base model; the -Instruct variants share
#: them), each checked against two public copies named in ``source``. Columns: hidden, intermediate, layers, heads,
#: kv heads, head_dim, vocab, max positions; every one ties its LM head to the embedding.
KNOWN: dict[str, Architecture] = {
    a.name: a
    for a in (
        # Also the packaged model's own config.json (MODEL_CACHE_DIR/SmolLM2-135M-Instruct, from the GGUF).
        _arch("SmolLM2-135M", "llama", f"{_LITGPT}; {_MLC}", 576, 1536, 30, 9, 3, 64, 49152, 8192),
        _arch("SmolLM2-360M", "llama", f"{_LITGPT}; {_MLC}", 960, 2560, 32, 15, 5, 64, 49152, 8192),
        # mlc-llm keeps this one commented out, with the same values.
        _arch("SmolLM2-1.7B", "llama", f"{_LITGPT}; {_MLC}", 2048, 8192, 24, 32, 32, 64, 49152, 8192),
        # Tied: Qwen's model cards say "tied word embeddings" for 0.5B-3B and count 0.49B / 1.54B / 3.09B in all,
        # 0.36B / 1.31B / 2.77B without the embedding; these counts follow from the fields below.
        _arch("Qwen2.5-0.5B", "qwen2", f"{_LITGPT}; Qwen's model card", 896, 4864, 24, 14, 2, 64, 151936, 32768),
        _arch("Qwen2.5-1.5B", "qwen2", f"{_LITGPT}; Qwen's model card", 1536, 8960, 28, 12, 2, 128, 151936, 131072),
        _arch("Qwen2.5-3B", "qwen2", f"{_LITGPT}; {_MLC}", 2048, 11008, 36, 16, 2, 128, 151936, 32768),
        _arch("Llama-3.2-1B", "llama", f"{_LITGPT}; {_MLC}", 2048, 8192, 16, 32, 8, 64, 128256, 131072),
        _arch("Qwen3-0.6B", "qwen3", f"{_LITGPT}; {_MLC}", 1024, 3072, 28, 16, 8, 128, 151936, 40960),
        _arch("Qwen3-1.7B", "qwen3", f"{_LITGPT}; {_MLC}", 2048, 6144, 28, 16, 8, 128, 151936, 40960),
    )
}
_HUB_ORGS = {"SmolLM2": "HuggingFaceTB", "Qwen2.5": "Qwen", "Qwen3": "Qwen", "Llama-3.2": "meta-llama"}
#: MODEL_NAME values that name a known architecture: its name, its Hub id, their -Instruct variants, the packaged
#: model's names (training.models.PACKAGED_SMOLLM2), all case-insensitive.
ALIASES: dict[str, str] = {}
for _name in KNOWN:
    _org = next(org for prefix, org in _HUB_ORGS.items() if _name.startswith(prefix))
    for _variant in (_name, f"{_name}-Instruct"):
        ALIASES[_variant.lower()] = _name
        ALIASES[f"{_org}/{_variant}".lower()] = _name
for _packaged in ("smollm2", "packaged:smollm2-135m-instruct"):
    ALIASES[_packaged] = "SmolLM2-135M"


def known_architecture(model_name: str) -> Architecture | None:
    """The table's architecture for a MODEL_NAME (name, Hub id, -Instruct, packaged name), else None."""
    key = ALIASES.get(model_name.strip().lower())
    return KNOWN[key] if key else None


def architecture_for(model_name: str, token: str | None = None) -> Architecture:
    """MODEL_NAME's architecture: the table's, a local folder's config.json, or the Hub's (online)."""
    known = known_architecture(model_name)
    if known is not None:
        return known
    path = Path(model_name).expanduser()
    if (path / "config.json").is_file():
        return Architecture.from_config(json.loads((path / "config.json").read_text()), path.name, str(path))
    if path.is_dir() or model_name.startswith((".", "/", "~")):
        raise UnknownModelError(f"MODEL_NAME={model_name!r}: no config.json in that folder (a save_pretrained one)")
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_name, token=token)
    except (OSError, ValueError) as exc:
        namesake = ALIASES.get(model_name.rsplit("/", 1)[-1].lower())  # e.g. another organisation's copy
        hint = f" (--model {namesake} if it is a copy of that one)" if namesake else ""
        raise UnknownModelError(
            f"MODEL_NAME={model_name!r}: not in the table of known architectures ({', '.join(KNOWN)}) and its "
            f"config.json could not be read ({type(exc).__name__}); go online, or name a local folder or one of "
            f"the table's models with the same layout{hint}"
        ) from None
    return Architecture.from_config(config, model_name, f"{model_name} config.json")


# -- settings --------------------------------------------------------------------------------


def auto_weight_dtype(requested: str, lora: bool, device_type: str, native_bf16: bool) -> str:
    """WEIGHT_DTYPE resolved as config.py documents it: auto is fp32 for a full fine-tune; with LoRA the frozen
    base is bf16 on a GPU that runs it natively, fp16 on other CUDA GPUs (a T4), fp32 on the CPU and mps."""
    if requested != "auto":
        return requested
    if not lora or device_type != "cuda":
        return "fp32"
    return "bf16" if native_bf16 else "fp16"


def auto_precision(requested: str, weight_dtype: str, device_type: str, native_bf16: bool) -> str:
    """PRECISION resolved as config.py documents it: auto is bf16 on a GPU that runs it natively, fp16 where the
    weights are fp16, else fp32."""
    if requested != "auto":
        return requested
    if device_type == "cuda" and native_bf16:
        return "bf16"
    return "fp16" if weight_dtype == "fp16" else "fp32"


@dataclass(frozen=True)
class Settings:
    """What sets a worker's memory besides its architecture; names follow the environment variables.

    ``weight_dtype`` and ``precision`` are resolved (:func:`auto_weight_dtype`, :func:`auto_precision`)."""

    num_train_samples: int = 8
    num_generations: int = 8
    num_transplant_trees: int = 0
    max_new_tokens: int = 256
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS
    micro_batch_size: int = 8
    gen_batch_size: int = 64
    eval_prompts: int = 0  # held-out prompts of one evaluation (greedy, one completion each)
    beta: float = 0.0
    weight_dtype: str = "fp32"
    precision: str = "fp32"
    lora_r: int = 0
    lora_target_modules: str = "all-linear"
    gradient_checkpointing: bool = False
    device_type: str = "cpu"

    def __post_init__(self) -> None:
        if self.weight_dtype not in DTYPE_BYTES or self.precision not in DTYPE_BYTES:
            raise ValueError(
                f"weight_dtype={self.weight_dtype!r}, precision={self.precision!r}: resolve auto first "
                "(auto_weight_dtype, auto_precision); each is one of fp32, bf16, fp16"
            )
        if self.device_type not in DEVICE_TYPES:
            raise ValueError(f"device_type={self.device_type!r}: use one of {', '.join(DEVICE_TYPES)}")

    @property
    def lora(self) -> bool:
        return self.lora_r > 0

    @property
    def train_sequences(self) -> int:
        """Sequences of one update: the I local and J external groups of G completions."""
        return (self.num_train_samples + self.num_transplant_trees) * self.num_generations

    @property
    def micro_batch(self) -> int:
        return min(self.micro_batch_size, self.train_sequences)

    @property
    def train_gen_sequences(self) -> int:
        """Sequences of one generate call of a round: GEN_BATCH_SIZE // G prompts (at least one) x G."""
        g = self.num_generations
        return min(self.num_train_samples, max(1, self.gen_batch_size // g)) * g

    @property
    def gen_sequences(self) -> int:
        """Sequences of the largest generate call: a round's, or an evaluation's (one greedy completion each)."""
        return max(self.train_gen_sequences, min(self.gen_batch_size, self.eval_prompts))


def settings_from(
    config: Any, device_type: str, native_bf16: bool = False, prompt_tokens: int | None = None
) -> Settings:
    """:class:`Settings` from a node's :class:`swarm_gdrive.config.Config` on a device of ``device_type``."""
    lora = config.lora_r > 0
    weight_dtype = auto_weight_dtype(config.weight_dtype, lora, device_type, native_bf16)
    tasks = len([t for t in (config.tasks or "").split(",") if t.strip()]) or 9  # unset: the paper's nine
    return Settings(
        num_train_samples=config.num_train_samples,
        num_generations=config.num_generations,
        num_transplant_trees=config.num_transplant_trees,
        max_new_tokens=config.max_new_tokens,
        prompt_tokens=prompt_tokens or DEFAULT_PROMPT_TOKENS,
        micro_batch_size=config.micro_batch_size,
        gen_batch_size=config.gen_batch_size,
        eval_prompts=config.eval_samples * tasks if config.eval_interval > 0 else 0,
        beta=config.beta,
        weight_dtype=weight_dtype,
        precision=auto_precision(config.precision, weight_dtype, device_type, native_bf16),
        lora_r=config.lora_r,
        lora_target_modules=config.lora_target_modules,
        gradient_checkpointing=config.gradient_checkpointing,
        device_type=device_type,
    )


# -- the estimate ----------------------------------------------------------------------------


def layer_bytes_per_token(arch: Architecture, weights16: bool, autocast16: bool) -> float:
    """Bytes autograd keeps per token and decoder layer for the backward pass (no checkpointing).

    In floats of ``h`` hidden, ``q`` = heads x head_dim, ``k`` = kv heads x head_dim, ``I`` intermediate,
    ``H`` heads: float32 weights and compute keep ``4 (4h + 5q + 4I + H)`` bytes; a 16-bit autocast over them
    ``24h + 10q + 8I + 4H`` (norms stay float32); 16-bit weights ``14h + 10q + 8I + 4H``. Qwen3's q/k norms add
    ``8 (q + k)`` (float32) or ``6 (q + k)`` bytes. Counted with saved_tensors_hooks (see the module docstring).
    """
    h, q, k, i, heads = arch.hidden_size, arch.q_dim, arch.kv_dim, arch.intermediate_size, arch.num_attention_heads
    if not weights16 and not autocast16:
        return 4 * (4 * h + 5 * q + 4 * i + heads) + 8 * (q + k) * arch.qk_norm
    norms = 14 * h if weights16 else 24 * h
    return norms + 10 * q + 8 * i + 4 * heads + 6 * (q + k) * arch.qk_norm


#: LoRA's extra bytes per float of a targeted linear's input (per token and layer), by (16-bit weights, 16-bit
#: autocast): peft casts each input to the adapters' float32, and a frozen linear keeps no input of its own.
#: Counted with saved_tensors_hooks on three layouts (peft 0.21, all-linear, r = 16): within 25 % of the extra.
_LORA_INPUT_BYTES = {(False, False): -0.8, (False, True): -0.3, (True, False): 2.5, (True, True): 0.8}


@dataclass(frozen=True)
class Estimate:
    """One worker's memory, in bytes, part by part; :attr:`peak` is their sum as the module docstring gives it."""

    architecture: Architecture
    settings: Settings
    parameters: int
    trainable: int
    weights: int
    reference: int
    gradients: int
    optimizer: int
    activations: int
    generation: int
    optimizer_step: int
    overhead: int  # the runtime: a CPU process's own memory, or the GPU's context
    allocator: int  # beyond the live tensors: glibc's heap on the CPU, the caching allocator's slack on a GPU
    logits: int  # of activations: the completion tokens' logits and log-softmax rows
    autocast_copies: int  # of activations and generation: 16-bit copies of float32 weights
    accumulates: bool  # more than one micro-batch per update: a forward pass meets all the gradients

    @property
    def resident(self) -> int:
        """What stays allocated between rounds: weights, reference, gradients, AdamW's moments."""
        return self.weights + self.reference + self.gradients + self.optimizer

    @property
    def training(self) -> int:
        """What training adds to :attr:`resident` at its peak. The update frees the gradients first
        (``zero_grad(set_to_none=True)``) and the backward pass rebuilds them layer by layer as it frees the
        activations, so with one micro-batch per update they overlap: ``max(activations, gradients)``; with
        gradient accumulation the second micro-batch's forward pass meets all of them: ``activations + gradients``.
        """
        return self.activations if self.accumulates else max(self.activations - self.gradients, 0)

    @property
    def transient(self) -> int:
        return max(self.training, self.generation, self.optimizer_step)

    @property
    def dominant(self) -> str:
        """Which transient sets the peak: training, generation or optimizer step."""
        parts = {"training": self.training, "generation": self.generation, "optimizer step": self.optimizer_step}
        return max(parts, key=parts.__getitem__)

    @property
    def peak(self) -> int:
        return self.resident + self.transient + self.overhead + self.allocator

    def fits(self, device_bytes: float) -> bool:
        return self.peak <= device_bytes

    def rows(self) -> list[tuple[str, int, str]]:
        """(part, bytes, what it is) for a printed breakdown."""
        s, a = self.settings, self.architecture
        train = f"LoRA r={s.lora_r} adapters (fp32)" if s.lora else f"every weight ({s.weight_dtype})"
        micro = f"{s.micro_batch} seq x {s.prompt_tokens}+{s.max_new_tokens} tokens"
        ckpt = ", checkpointed" if s.gradient_checkpointing else ""
        return [
            ("weights", self.weights, f"{self.parameters / 1e6:.0f}M parameters in {s.weight_dtype}"),
            ("reference", self.reference, "frozen copy for BETA > 0" if self.reference else "none"),
            ("gradients", self.gradients, f"{self.trainable / 1e6:.1f}M trainable: {train}"),
            ("optimizer", self.optimizer, "AdamW's two moments"),
            ("training", self.activations, f"one micro-batch ({micro}{ckpt}), logits {_gib(self.logits)}"),
            ("generation", self.generation, f"{s.gen_sequences} seq KV cache + buffers ({a.num_hidden_layers} layers)"),
            ("optimizer step", self.optimizer_step, "AdamW's temporaries"),
            ("runtime", self.overhead, _overhead_text(s.device_type)),
            ("allocator", self.allocator, _allocator_text(s.device_type)),
            ("peak", self.peak, f"resident + largest of training/generation/step ({self.dominant}) + the two above"),
        ]


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def _overhead_text(device_type: str) -> str:
    return {
        "cpu": "the process before its model: Python, torch, transformers (measured)",
        "cuda": "CUDA context (estimated)",
    }.get(device_type, "the process and Metal's context (estimated)")


def _allocator_text(device_type: str) -> str:
    if device_type == "cpu":
        return "freed memory glibc keeps (measured range; MALLOC_MMAP_THRESHOLD_ removes it)"
    return "caching allocator's fragmentation, 10 % (estimated)"


def training_activations(arch: Architecture, s: Settings) -> tuple[int, int]:
    """(all, logits) bytes of one micro-batch's forward and backward, excluding weight copies."""
    weights16, autocast16 = s.weight_dtype != "fp32", s.precision != "fp32"
    b, p, t = s.micro_batch, s.prompt_tokens, s.max_new_tokens
    tokens, seq = b * (p + t), p + t
    per_layer = layer_bytes_per_token(arch, weights16, autocast16)
    if s.lora:
        inputs = sum(i for i, _ in arch.targeted(s.lora_target_modules).values())
        per_layer += _LORA_INPUT_BYTES[(weights16, autocast16)] * inputs + 8 * s.lora_r * len(
            arch.targeted(s.lora_target_modules)
        )
    forward = 2 if (weights16 or autocast16) else 4
    mask = b * seq * seq * forward  # SDPA's float copy of the padding mask, one per layer
    layers = arch.num_hidden_layers
    if s.gradient_checkpointing:  # layer inputs (the residual stream) kept, one layer recomputed at a time
        residual = 2 if weights16 else 4
        stack = layers * tokens * arch.hidden_size * residual + tokens * per_layer + mask
    else:
        stack = layers * (tokens * per_layer + mask)
    vocab = arch.vocab_size
    logits = b * (t + 1) * vocab * forward + b * t * vocab * 4 + 2 * t * vocab * 4
    final = 12 * tokens * arch.hidden_size  # the final norm and the LM head's input
    return int(stack + logits + final), int(logits)


def generation_bytes(arch: Architecture, s: Settings) -> int:
    """A generate call's KV cache over prompt + completion, its prefill temporaries and the sampler's buffers."""
    n, p, t = s.gen_sequences, s.prompt_tokens, s.max_new_tokens
    act = 2 if (s.weight_dtype != "fp32" or s.precision != "fp32") else 4
    kv = 2 * arch.num_hidden_layers * n * (p + t) * arch.kv_dim * act
    h, i, q = arch.hidden_size, arch.intermediate_size, arch.q_dim
    prefill = n * p * (3 * i + 3 * h + 4 * q) * act + n * p * p * act  # one layer's MLP/attention temporaries, mask
    sampler = 6 * n * arch.vocab_size * 4  # float32 logits, temperature, softmax, top-p sort (values + indices)
    growing = 2 * n * (p + t) * arch.kv_dim * act  # one layer's cache while torch.cat copies it a token longer
    return int(kv + max(prefill, sampler) + growing)


def estimate(arch: Architecture, s: Settings) -> Estimate:
    """The memory one worker needs for ``arch`` under settings ``s``: see the module docstring for each part."""
    wb = DTYPE_BYTES[s.weight_dtype]
    n_params = arch.parameters()
    weights = n_params * wb
    embedding = arch.vocab_size * arch.hidden_size
    if s.lora:
        trainable, train_bytes = arch.lora_parameters(s.lora_r, s.lora_target_modules), 4
        weights += trainable * 4
        reference = 0  # the base with adapters disabled is the reference
        largest = max(s.lora_r * max(a, b) for a, b in arch.targeted(s.lora_target_modules).values())
        embed_grad = 0
    else:
        trainable, train_bytes = n_params, wb
        reference = weights if s.beta > 0 else 0
        largest = embedding
        embed_grad = embedding * train_bytes * (1 if arch.tie_word_embeddings else 2)
    gradients = trainable * train_bytes
    optimizer = 2 * trainable * train_bytes
    foreach = s.device_type != "cpu"
    optimizer_step = trainable * train_bytes if foreach else 2 * largest * train_bytes
    # 16-bit copies of float32 weights, every layer's linears and the LM head (not the embedding lookup): autocast
    # caches those that train, and autograd keeps frozen ones for the backward pass too; generating, only the cache.
    linears = arch.num_hidden_layers * sum(a * b for a, b in arch.linears().values()) + embedding
    autocast_copies = 2 * linears if (s.precision != "fp32" and s.weight_dtype == "fp32") else 0
    gen_copies = 0 if s.lora else autocast_copies
    acts, logits = training_activations(arch, s)
    activations = acts + autocast_copies + embed_grad
    generation = generation_bytes(arch, s) + gen_copies
    resident = weights + reference + gradients + optimizer
    accumulates = s.train_sequences > s.micro_batch
    training = activations if accumulates else max(activations - gradients, 0)  # see Estimate.training
    transient = max(training, generation, optimizer_step)
    if s.device_type == "cpu":
        overhead = CPU_PROCESS_BYTES
        allocator = CPU_HEAP_LORA if s.lora else int(CPU_HEAP_SHARE * (activations + gradients))
    else:
        overhead = CUDA_CONTEXT_BYTES if s.device_type == "cuda" else CPU_PROCESS_BYTES + MPS_CONTEXT_BYTES
        allocator = int(CUDA_ALLOCATOR_SLACK * (resident + transient))
    return Estimate(
        architecture=arch,
        settings=s,
        parameters=n_params,
        trainable=trainable,
        weights=weights,
        reference=reference,
        gradients=gradients,
        optimizer=optimizer,
        activations=activations,
        generation=generation,
        optimizer_step=optimizer_step,
        overhead=overhead,
        allocator=allocator,
        logits=logits,
        autocast_copies=autocast_copies,
        accumulates=accumulates,
    )


def workers_that_fit(est: Estimate, device_bytes: float) -> int:
    """How many such workers share a device of ``device_bytes``: one context each on a GPU, as separate processes."""
    return max(0, math.floor(device_bytes / est.peak)) if est.peak > 0 else 0


def breakdown(est: Estimate) -> str:
    """The estimate as an aligned text table, GiB."""
    lines = [f"{'part':<15} {'GiB':>7}  what"]
    lines += [f"{part:<15} {n / GIB:>7.2f}  {text}" for part, n, text in est.rows()]
    return "\n".join(lines)


def as_dict(est: Estimate) -> dict[str, Any]:
    """Every part in bytes plus the settings and architecture, for a result file."""
    out = {f.name: getattr(est, f.name) for f in fields(est) if f.name not in ("architecture", "settings")}
    out["peak"] = est.peak
    out["dominant"] = est.dominant
    out["settings"] = {f.name: getattr(est.settings, f.name) for f in fields(est.settings)}
    out["architecture"] = est.architecture.name
    return out
