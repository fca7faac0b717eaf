"""A tiny Llama model and byte-level BPE tokenizer built on the spot (no hub): fast tests and `demo --tiny`.

``build_tiny_model(folder)`` writes a folder that ``AutoModelForCausalLM`` and
``AutoTokenizer`` load like any hub checkpoint: about 1M parameters, a chat template,
eos/pad tokens and left padding.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<|pad|>", "<|eos|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
CORPUS = [
    "What is 3 + 4? <answer>7</answer>",
    "Convert the number 12 from base 10 to base 2. <answer>1100</answer>",
    "Please think step by step, then give only the final answer inside <answer></answer> tags.",
    "The quick brown fox jumps over the lazy dog 0123456789 + - * / = ( ) [ ] , . ? !",
] * 20


def build_tiny_model(folder: str | Path, seed: int = 0, chat_template: bool = True) -> Path:
    """Write a tiny causal LM and its tokenizer to ``folder``; returns the folder."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = Path(folder)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|eos|>", padding_side="left"
    )
    if chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    return folder


def teach_answer_format(folder: str | Path, steps: int = 80, seed: int = 0) -> Path:
    """Fine-tune the tiny model in ``folder`` to answer arithmetic prompts as ``<answer>N</answer>``.

    N is random, so afterwards its completions carry the answer tag often and are right
    sometimes: groups with reward variance, which an untrained random model never gives.
    """
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        texts = []
        for _ in range(16):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            prompt = [{"role": "user", "content": f"What is {a} + {b}?"}]
            head = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
            texts.append(f"{head}<answer>{rng.randint(0, 18)}</answer>{tokenizer.eos_token}")
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        loss = model(**batch, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(folder)
    return folder
