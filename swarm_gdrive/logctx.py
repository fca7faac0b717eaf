"""Node id and round in every log line: a logging filter fed by the running node."""

from __future__ import annotations

import logging
import sys

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


class RedactingFormatter(logging.Formatter):
    """Redacts secrets from the whole formatted line, tracebacks included."""

    def __init__(self, fmt: str, secrets: list[str]) -> None:
        super().__init__(fmt)
        self.secrets = [s for s in secrets if s]

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        for secret in self.secrets:
            text = text.replace(secret, "<redacted>")
        return text


def _redact_every_record(secrets: list[str]) -> None:
    """Redact at record creation, so loggers with their own handlers (transformers, huggingface_hub) do too."""
    secrets = [s for s in secrets if s]
    if not secrets:
        return
    previous = logging.getLogRecordFactory()
    redact = RedactFilter(secrets)

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        redact.filter(record)
        return record

    logging.setLogRecordFactory(factory)


class BelowFilter(logging.Filter):
    """Passes the records under ``level`` only."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < self.level


def setup(level: str, secrets: list[str] | None = None) -> None:
    """Configure the root logger once, for a node process; ``secrets`` never reach the output.

    Ordinary lines (DEBUG, INFO) go to standard output, warnings and errors to standard error: Colab and Jupyter
    colour standard error red, and a node's progress is not an error. Both streams are the ones of the moment
    (a notebook kernel's own, in a kernel)."""
    secrets = [s for s in secrets or [] if s]
    _redact_every_record(secrets)
    ordinary = logging.StreamHandler(sys.stdout)
    ordinary.addFilter(BelowFilter(logging.WARNING))
    problems = logging.StreamHandler(sys.stderr)
    problems.setLevel(logging.WARNING)
    for handler in (ordinary, problems):
        handler.addFilter(ContextFilter())
        handler.addFilter(RedactFilter(secrets))
        handler.setFormatter(RedactingFormatter(FORMAT, secrets))
    root = logging.getLogger()
    root.handlers[:] = [ordinary, problems]
    root.setLevel(level)
