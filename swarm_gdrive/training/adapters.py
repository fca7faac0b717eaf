"""LoRA adapters through ``peft``, gradient checkpointing, and the dtype the weights are kept in.

With LORA_R > 0 the model's weights are frozen and low-rank adapters (``peft.LoraConfig``: LORA_R,
LORA_ALPHA, LORA_DROPOUT, LORA_TARGET_MODULES) are the only trained parameters. peft keeps the adapters
in float32 whatever the base's dtype (``autocast_adapter_dtype``), so AdamW's state is float32 too,
while the frozen base may be bfloat16 or float16 (WEIGHT_DTYPE). With BETA > 0 the KL reference is the
same model with its adapters disabled: no second copy. Checkpoints and Hub pushes then hold the
adapters alone (``adapter_model.safetensors`` and ``adapter_config.json``); the base is MODEL_NAME.

Gradient checkpointing (GRADIENT_CHECKPOINTING) is transformers' own, non-reentrant: the same gradients
for about a third more training time, and only a layer's activations held at once.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch import Tensor

logger = logging.getLogger(__name__)

#: WEIGHT_DTYPE's names to torch dtypes.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
#: An adapter_config.json is a few KB; more is not one peft wrote.
MAX_ADAPTER_CONFIG_BYTES = 256 * 1024


class SettingsMismatchError(RuntimeError):
    """A checkpoint was trained with other LoRA settings than the node has now; the message says what to set."""


@dataclass(frozen=True)
class LoraSettings:
    """LORA_R, LORA_ALPHA, LORA_DROPOUT and LORA_TARGET_MODULES (``all-linear`` or a comma list)."""

    r: int
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: str = "all-linear"

    def peft_config(self) -> Any:
        from peft import LoraConfig

        targets = "all-linear" if self.target_modules == "all-linear" else self.target_modules.split(",")
        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=targets,
            bias="none",
            task_type="CAUSAL_LM",
        )


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def is_lora(model: Any) -> bool:
    """Whether ``model`` is a peft model with adapters (its reference is itself with them disabled)."""
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def weight_dtype(model: Any) -> torch.dtype:
    """The dtype of the model's (base) weights: its input embeddings'."""
    return model.get_input_embeddings().weight.dtype


def apply_lora(model: Any, lora: LoraSettings, base_name: str | None = None) -> Any:
    """Wrap ``model`` in a peft model with LoRA adapters on LORA_TARGET_MODULES; the base is frozen.

    ``base_name`` (MODEL_NAME) is what adapter_config.json and the Hub's model card name as the base, instead of
    the folder it was loaded from (a path on this node's disk). A target list that matches no module is refused
    naming the model's linear layers."""
    from peft import get_peft_model

    if base_name is not None:  # what peft writes as the base: adapter_config.json, the model card's base_model
        model.config._name_or_path = base_name
        model.name_or_path = base_name
    try:
        wrapped = get_peft_model(model, lora.peft_config())
    except ValueError as exc:
        linear = sorted(
            {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        )
        raise ValueError(
            f"LORA_TARGET_MODULES={lora.target_modules!r} does not fit this model ({exc}); its linear layers are "
            f"{', '.join(linear)}: name some of them, or use all-linear"
        ) from None
    return wrapped


def enable_gradient_checkpointing(model: Any) -> None:
    """transformers' gradient checkpointing, non-reentrant (so frozen inputs need no ``requires_grad`` hook).

    It only acts in training mode, so generation (``model.eval()``) keeps its KV cache."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(
            f"GRADIENT_CHECKPOINTING=true: {type(model).__name__} does not support gradient checkpointing; "
            "set GRADIENT_CHECKPOINTING=false"
        )
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5.x's name; the old one warns until v6
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def trainable_summary(model: Any) -> dict[str, Any]:
    """What is trained and in which precision: for the log line and the node's metrics."""
    params = list(model.parameters())
    trained = [p for p in params if p.requires_grad]
    dtypes = sorted({dtype_name(p.dtype) for p in trained})
    return {
        "parameters": sum(p.numel() for p in params),
        "trainable": sum(p.numel() for p in trained),
        "weights": dtype_name(weight_dtype(model)),
        "trained_dtype": ",".join(dtypes),
        "lora": is_lora(model),
    }


def check_adapter_config(folder: Path, lora: LoraSettings) -> None:
    """The checkpoint's adapter_config.json against the node's LoRA settings (rank, alpha, dropout ignored)."""
    path = folder / ADAPTER_CONFIG
    if path.stat().st_size > MAX_ADAPTER_CONFIG_BYTES:
        raise ValueError(f"{ADAPTER_CONFIG} is over {MAX_ADAPTER_CONFIG_BYTES} bytes")
    saved = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(saved, dict):
        raise ValueError(f"{ADAPTER_CONFIG} is not a JSON object")
    r, alpha = saved.get("r"), saved.get("lora_alpha")
    if r != lora.r or alpha is None or float(alpha) != float(lora.alpha):
        raise SettingsMismatchError(
            f"the checkpoint's LoRA adapters have rank {r} and alpha {alpha}, but LORA_R={lora.r} and "
            f"LORA_ALPHA={lora.alpha:g} now: set them back to resume, or give this node another NODE_ID to start "
            "afresh"
        )


def load_adapters(model: Any, folder: Path, lora: LoraSettings) -> None:
    """Load a checkpoint's adapters into ``model`` (a peft model); every adapter tensor must be there, same shape.

    Only safetensors is read (never ``adapter_model.bin``); a different rank or other target modules is a
    :class:`SettingsMismatchError` naming the variables to set."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    check_adapter_config(folder, lora)
    saved = load_file(str(folder / ADAPTER_WEIGHTS))
    expected: dict[str, Tensor] = get_peft_model_state_dict(model)
    missing, extra = sorted(set(expected) - set(saved)), sorted(set(saved) - set(expected))
    shapes = [k for k in expected if k in saved and saved[k].shape != expected[k].shape]
    if missing or extra or shapes:
        raise SettingsMismatchError(
            f"the checkpoint's adapters do not fit LORA_TARGET_MODULES={lora.target_modules!r} and LORA_R={lora.r} "
            f"({len(missing)} missing, {len(extra)} unexpected, {len(shapes)} of another shape, e.g. "
            f"{(missing + extra + shapes)[0]}): set the LoRA variables the checkpoint was trained with, or give "
            "this node another NODE_ID to start afresh"
        )
    set_peft_model_state_dict(model, saved)
