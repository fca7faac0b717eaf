"""Pushing a node's model to the Hugging Face Hub. The token is used, never logged or written."""

from __future__ import annotations

import logging
import tempfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


def push(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    token: str,
    repo_id: str | None,
    experiment: str,
    node_id: str,
    round_: int,
) -> bool:
    """Upload the model and tokenizer (safetensors) to ``repo_id``; False (and a logged reason) on failure.

    A failed push never stops training: the Hub may be unreachable from the node.
    """
    try:
        from huggingface_hub import HfApi

        api = HfApi(token=token)
        target = repo_id or f"{api.whoami()['name']}/{experiment}-{node_id}"
        api.create_repo(target, private=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="swarm-hub-") as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            api.upload_folder(folder_path=tmp, repo_id=target, commit_message=f"{node_id} round {round_}")
    except Exception as exc:  # noqa: BLE001 - any failure is reported, none is fatal
        logger.warning("push to the Hub failed: %s", redact(f"{type(exc).__name__}: {exc}", token))
        return False
    logger.info("pushed round %d to the Hub as %s", round_, target)
    return True


def redact(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` replaced."""
    return text.replace(secret, "<redacted>") if secret else text
