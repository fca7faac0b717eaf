"""One entry point for the benchmarks: ``python -m bench <part> [options]``.

Parts: coordination, generation, training, learning, study (SAPO, replicated swarms), defaults (training-setting
sweep), precision (PRECISION against fp32), memory (the memory estimate against measured peaks, and a round's
time), demo (the demo's profile, phase by phase), evaluation (the held-out evaluation with the default settings, or
with --round a round's generation, against an older tree), drive_budget (a worker's Drive writes in an hour),
rounds (ROUND_MODE sync against async: idle, fill, staleness, requests), modes (learning in the two round modes,
paired by seed), readers (status, validate, report and the dashboard on 50,000 planted peer files and 1 GiB of
junk); ``all`` runs coordination, generation and training with their defaults. Each part writes
``bench/results/<part>_<machine>.json`` and ``.md``.
``python -m bench <part> --help`` lists a part's options.
"""

from __future__ import annotations

import importlib
import sys
import time

PARTS = {
    "coordination": "bench.coordination",
    "generation": "bench.generation",
    "training": "bench.training",
    "learning": "bench.learning",
    "study": "bench.study",
    "defaults": "bench.defaults",
    "precision": "bench.precision",
    "memory": "bench.memory_check",
    "demo": "bench.demo",
    "evaluation": "bench.evaluation",
    "drive_budget": "bench.drive_budget",
    "rounds": "bench.rounds",
    "modes": "bench.modes",
    "readers": "bench.readers",
}
ALL = ("coordination", "generation", "training")


def run_part(part: str, argv: list[str]) -> int:
    """Import the part's module only now (the learning part may not exist yet) and run its ``main``."""
    try:
        module = importlib.import_module(PARTS[part])
    except ModuleNotFoundError as exc:
        if exc.name != PARTS[part]:
            raise
        print(f"benchmark part {part!r}: {PARTS[part].replace('.', '/')}.py is not there yet", file=sys.stderr)
        return 2
    started = time.monotonic()
    code = module.main(argv)
    print(f"== {part}: exit {code} after {time.monotonic() - started:.0f} s", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help") or args[0] not in (*PARTS, "all"):
        print(__doc__.strip(), file=sys.stderr)
        return 0 if args and args[0] in ("-h", "--help") else 2
    part, rest = args[0], args[1:]
    if part == "all":
        if rest:
            print("python -m bench all takes no options; run the parts one by one to pass options", file=sys.stderr)
            return 2
        started = time.monotonic()
        codes = [run_part(p, []) for p in ALL]
        print(f"== all: {time.monotonic() - started:.0f} s", file=sys.stderr)
        return max(codes)
    return run_part(part, rest)


if __name__ == "__main__":
    sys.exit(main())
