"""The process that runs math-verify for :class:`swarm_gdrive.training.dataset_task._MathChecker`.

Started as ``python -m swarm_gdrive.training.math_child`` (no pickling, no import of the parent's ``__main__``):
it prints ``ready``, then reads one JSON line ``[reference, answer]`` at a time from standard input and prints the
check's score (``1.0`` or ``0.0``). math-verify's own timeouts are off (they need SIGALRM); the parent kills this
process when a check outlasts its limit.
"""

from __future__ import annotations

import functools
import json
import logging
import sys


def main() -> None:
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every call made without a timeout

    @functools.lru_cache(maxsize=4096)
    def parsed(text: str) -> object:
        return parse(text if "$" in text else f"${text}$", parsing_timeout=None)

    print("ready", flush=True)
    for line in sys.stdin:
        try:
            reference, answer = json.loads(line)
            score = float(bool(verify(parsed(str(reference)), parsed(str(answer)), timeout_seconds=None)))
        except Exception:  # noqa: BLE001 - math-verify on a peer's text: a failure scores nothing
            score = 0.0
        print(score, flush=True)


if __name__ == "__main__":
    main()
