"""How a completion travels between nodes: its stop reason, its sampled ids, and the ids a receiver trains on.

A sender publishes each completion's text, why it ended (``eos``: the model sampled an eos token;
``length``: it reached MAX_NEW_TOKENS, or its text was cut to fit a rollout file) and, with a fingerprint of
its tokenizer, the ids it sampled (the answer prefix's in front, eos left out). A receiver whose tokenizer has
the same fingerprint trains on those ids when they are consistent with the text: every id in its vocabulary,
no special token, and decoding to exactly the text that was sent; else it re-tokenizes the text (special
tokens' names in it stay plain text). Either way the completion is cut to MAX_NEW_TOKENS and eos is appended
only when the record says the completion stopped on eos and there is room for it: a receiver never invents
an eos, and a record of an older version (no stop reasons) gets none.

A completion is scored on exactly what it is trained on: :attr:`Received.text`, the decoding of its training ids
(eos left out), never the text as sent. The two differ only where the ids ran past MAX_NEW_TOKENS and were cut
(or a re-tokenized text does not decode back to itself): a tail past the cap, with a right answer in it, would
otherwise buy a reward for the tokens in front of it, which are all that is trained (issue #30, class 4). Such a
completion is cut and scored, not refused: MAX_NEW_TOKENS is not an experiment setting (config.FINGERPRINT_FIELDS),
so an honest peer may sample more tokens than this node does, and another tokenizer may count more tokens.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from swarm_gdrive.protocol.records import MAX_COMPLETION_CHARS

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: How an external completion's training ids were obtained.
How = Literal["sampled", "retokenized", "rejected"]


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """16 hex chars of a sha256 over what maps text to ids: vocabulary, merges, added and special tokens.

    A fast tokenizer is hashed through its full ``tokenizers`` JSON (normalizer, pre-tokenizer, model,
    added tokens), less the padding and truncation settings a caller may change at run time.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        spec = json.loads(backend.to_str())
        spec.pop("truncation", None)
        spec.pop("padding", None)
    else:  # a slow tokenizer: its vocabulary, added tokens included
        spec = {"vocab": sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])}
    spec["eos_token_id"] = tokenizer.eos_token_id
    spec["special_ids"] = sorted(special_ids(tokenizer))
    blob = json.dumps(spec, sort_keys=True, ensure_ascii=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def special_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Ids that ``decode(skip_special_tokens=True)`` drops: they never appear in a shared text."""
    ids = set(tokenizer.all_special_ids)
    ids.update(i for i, token in getattr(tokenizer, "added_tokens_decoder", {}).items() if token.special)
    return ids


@dataclass(frozen=True)
class Outgoing:
    """One completion as it is published."""

    text: str
    stop_reason: Literal["eos", "length"]
    token_ids: list[int] | None


@dataclass(frozen=True)
class Received:
    """One external completion as it is trained: its ids, the text they decode to, and how they were obtained.

    ``text``: the decoding of ``ids`` (eos left out), the only text a receiver may score: the sent text when it
    fits MAX_NEW_TOKENS, else the part of it that was kept. ``differs``: with the sender's ids, whether
    re-tokenizing the text would have given other ids. ``cut``: whether the ids ran past MAX_NEW_TOKENS.
    """

    ids: list[int]
    text: str
    how: How
    differs: bool = False
    cut: bool = False


class CompletionCodec:
    """A node's side of the completion exchange, for one tokenizer and one MAX_NEW_TOKENS."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, eos_ids: set[int], max_new_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = set(eos_ids)
        self.eos_id = tokenizer.eos_token_id
        self.max_new_tokens = max_new_tokens
        self.fingerprint = tokenizer_fingerprint(tokenizer)
        self.special = special_ids(tokenizer)
        self.vocab_size = len(tokenizer)

    def encode(self, text: str) -> list[int]:
        """The ids of a text known only as text; names of special tokens in it are plain text."""
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]

    def consistent(self, ids: list[int], text: str) -> bool:
        """Whether ``ids`` are in this vocabulary, hold no special token and decode to exactly ``text``."""
        if any(not 0 <= i < self.vocab_size or i in self.special for i in ids):
            return False
        return self.tokenizer.decode(ids, skip_special_tokens=True) == text

    def outgoing(self, prefix: str, prefix_ids: list[int], generated: list[int], text: str) -> Outgoing:
        """A local completion for the rollout file: ``prefix`` + decoded ``text``, its stop reason and ids.

        ``generated`` are the sampled ids (a final eos included when the model stopped). A text cut to fit a
        rollout file is marked ``length`` and travels without ids (they would not match it).
        """
        stopped = bool(generated) and generated[-1] in self.eos_ids
        full = prefix + text
        shared = full[:MAX_COMPLETION_CHARS]
        if len(text) >= MAX_COMPLETION_CHARS or len(full) > MAX_COMPLETION_CHARS:
            return Outgoing(shared, "length", None)
        ids = prefix_ids + (generated[:-1] if stopped else generated)
        return Outgoing(shared, "eos" if stopped else "length", ids if self.consistent(ids, shared) else None)

    def incoming(self, text: str, stop_reason: str | None, ids: list[int] | None, fingerprint: str | None) -> Received:
        """The ids to train an external completion on, and the text to score it on (module docstring)."""
        how: How = "retokenized"
        differs = False
        if ids is not None and fingerprint == self.fingerprint:
            if self.consistent(ids, text):
                how = "sampled"
                differs = self.encode(text) != ids
            else:
                how = "rejected"
        tokens = list(ids) if how == "sampled" and ids is not None else self.encode(text)
        cut = len(tokens) > self.max_new_tokens
        kept = tokens[: self.max_new_tokens]
        # Sampled ids that were not cut decode to ``text`` (consistent() checked it): no second decode.
        scored = text if how == "sampled" and not cut else self.tokenizer.decode(kept, skip_special_tokens=True)
        return Received(self.finish(kept, stop_reason == "eos"), scored, how, differs, cut)

    def finish(self, tokens: list[int], stopped_on_eos: bool) -> list[int]:
        """Cut to MAX_NEW_TOKENS; eos appended only after a completion that stopped on eos, if it fits."""
        tokens = tokens[: self.max_new_tokens]
        if stopped_on_eos and len(tokens) < self.max_new_tokens and self.eos_id is not None:
            tokens.append(self.eos_id)
        return tokens


def external_metrics(received: list[Received]) -> dict[str, float]:
    """The ``external/*`` keys of a stage's metric line (docs/training.md)."""
    counts = Counter(r.how for r in received)
    return {
        "external/completions": float(len(received)),
        "external/sampled_ids": float(counts["sampled"]),
        "external/retokenized": float(counts["retokenized"] + counts["rejected"]),
        "external/ids_rejected": float(counts["rejected"]),
        "external/retokenize_differs": float(sum(r.differs for r in received)),
        "external/cut_to_cap": float(sum(r.cut for r in received)),
    }
