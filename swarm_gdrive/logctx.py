"""Node id and round in every log line: a logging filter fed by the running node."""

from __future__ import annotations

import logging

_context: dict[str, object] = {"node_id": "-", "round": "-"}

FORMAT = "%(asctime)s %(levelname)s [%(node_id)s r%(round)s] %(name)s: %(message)s"


def set_node(node_id: str) -> None:
    _context["node_id"] = node_id


def set_round(round_: int | None) -> None:
    _context["round"] = "-" if round_ is None else round_


class ContextFilter(logging.Filter):
    """Adds ``node_id`` and ``round`` to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.node_id = _context["node_id"]
        record.round = _context["round"]
        return True


class RedactFilter(logging.Filter):
    """Replaces secrets (the Hub token) in every formatted message, whatever logged it."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            message = record.getMessage()
            for secret in self.secrets:
                message = message.replace(secret, "<redacted>")
            record.msg, record.args = message, None
        return True


def setup(level: str, secrets: list[str] | None = None) -> None:
    """Configure the root logger once, for a node process; ``secrets`` never reach the output."""
    handler = logging.StreamHandler()
    handler.addFilter(ContextFilter())
    handler.addFilter(RedactFilter(secrets or []))
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
