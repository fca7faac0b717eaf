"""Run by tests/integration/test_gguf_conversion.py with another environment's python (the Colab-like venv:
transformers 4.57): convert the packaged SmolLM2 with ``packaged_smollm2`` into ``argv[1]``, the slow
``from_pretrained(gguf_file=...)`` conversion forbidden, and compare the folder with that transformers' own GGUF
loading. Prints one JSON line: the transformers version, the conversion's seconds, and every mismatch found.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from swarm_gdrive.training import models  # noqa: E402

TEXTS = ["What is 7 + 5?", " leading space", "<|im_start|>user\nhi<|im_end|>", "ÀÉÎõü ß ∑ ∞ 日本語"]


def _no_fallback(*args: object, **kwargs: object) -> None:
    raise AssertionError("the conversion fell back to from_pretrained(gguf_file=...)")


def main(cache: Path) -> dict:
    models._convert_gguf_via_from_pretrained = _no_fallback
    started = time.perf_counter()
    converted = models.packaged_smollm2(cache)
    seconds = time.perf_counter() - started
    spec = importlib.util.find_spec(models._GGUF_PACKAGE)
    folder = Path(list(spec.submodule_search_locations)[0])
    mismatches = _model_mismatches(folder, converted) + _tokenizer_mismatches(folder, converted)
    return {"transformers": transformers.__version__, "seconds": seconds, "mismatches": mismatches}


def _model_mismatches(folder: Path, converted: Path) -> list[str]:
    mismatches = []
    reference = AutoModelForCausalLM.from_pretrained(folder, gguf_file=models._GGUF_FILE, dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32, use_safetensors=True)
    expected, got = reference.state_dict(), model.state_dict()
    if list(got) != list(expected):
        mismatches.append(f"parameter names: {sorted(set(got) ^ set(expected))}")
    for name, tensor in expected.items():
        if name in got and not (
            got[name].dtype == tensor.dtype == torch.float32
            and got[name].shape == tensor.shape
            and torch.equal(got[name].view(torch.int32), tensor.view(torch.int32))
        ):
            mismatches.append(f"tensor {name}")
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        mismatches.append("lm_head is not tied to the embedding")
    reference_config = AutoConfig.from_pretrained(folder, gguf_file=models._GGUF_FILE).to_dict()
    config = model.config.to_dict()
    for source_specific in ("quantization_config", "_name_or_path", "dtype", "torch_dtype", "architectures"):
        reference_config.pop(source_specific, None)
        config.pop(source_specific, None)
    if config != reference_config:
        mismatches.append(f"config: {config} != {reference_config}")
    if model.generation_config.to_dict() != reference.generation_config.to_dict():
        mismatches.append("generation config")
    return mismatches


def _tokenizer_mismatches(folder: Path, converted: Path) -> list[str]:
    mismatches = []
    reference_tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=models._GGUF_FILE)
    tokenizer = AutoTokenizer.from_pretrained(converted)
    if type(tokenizer) is not type(reference_tokenizer):
        mismatches.append(f"tokenizer class {type(tokenizer).__name__} != {type(reference_tokenizer).__name__}")
    with tempfile.TemporaryDirectory() as saved:
        reference_tokenizer.save_pretrained(saved)  # what the slow conversion writes: the same files, byte for byte
        for file in sorted(Path(saved).iterdir()):
            if (converted / file.name).read_bytes() != file.read_bytes():
                mismatches.append(f"tokenizer file {file.name}")
    messages = [{"role": "user", "content": "What is 7 + 5?"}]
    text = reference_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) != text:
        mismatches.append("chat template")
    for sample in [*TEXTS, text]:
        if tokenizer(sample)["input_ids"] != reference_tokenizer(sample)["input_ids"]:
            mismatches.append(f"token ids of {sample!r}")
    return mismatches


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
