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


def setup(level: str) -> None:
    """Configure the root logger once, for a node process."""
    handler = logging.StreamHandler()
    handler.addFilter(ContextFilter())
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
