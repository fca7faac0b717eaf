"""Randomised fault trials against real node processes, with a summary table.

    python tests/faults/run_trials.py --trials 20 --seed 1 [--kinds worker,coordinator,oserror,mixed] [--out DIR]
    python tests/faults/run_trials.py --kinds mixed --trials 100 --seed 16 --out mixed-c   # issue 14: seeds 16, 17

Each trial starts a fresh swarm (a coordinator and 3 workers, synthetic workload, 4 rounds) on a temporary
folder and injects one fault chosen at random from the seed:

- ``worker``: SIGKILL of a worker at a random point (mid generation, mid publish, mid update, mid submit,
  mid log flush, or a random moment) of a random round, with a random publish frequency; restarted with
  the same NODE_ID.
- ``coordinator``: SIGKILL of the coordinator mid state write, mid log flush, or at a random moment of a
  random round; restarted with the same NODE_ID.
- ``oserror``: bursts of EIO / ENOTCONN in every node's local backend.
- ``mixed``: a hostile file of a random class (tests/faults/hostile_mix.py: hostile.py's files, a huge integer,
  type confusion, symbolic links out of the folder, a forged state for under a second, names that collide by case
  or that Windows reserves, malformed checkpoint manifests, a flood of unregistered rollouts, a second process
  with a running worker's NODE_ID; issue 30's: a hard link out of the folder at a node's log, names that are not
  UTF-8, a forged run in experiment.json and the state, a second coordinator with RESET_EXPERIMENT=true) planted
  at a random moment, and a SIGKILL of a random node (coordinator or worker) at another, restarted; then every
  node is started once more. Counted per trial: crashes (a node that was not killed exiting 1, a reader raising),
  lost submissions, bytes written outside the folder, early exits (a worker exiting 0 without all its rounds),
  nodes unable to restart (the restarted node, then every node once the run is over, must exit 0). ``--classes``
  draws from some classes only (issue 30's: ``--classes hard_link,names_not_utf8,forged_run,rival_coordinator``).

``--round-mode async`` gives the coordinator ROUND_MODE=async (GDRIVE_IMPLEMENTATION.md §5.10): each worker plays
its own rounds, a kill's round is the victim's own (any worker's for the coordinator), and the coordinator is
killed mid its finishing state write or at a random moment.

Every trial checks the suite's properties (tests/faults/trials.py): survivors exit 0; no reader ever saw a
partial file; every submission of a live worker is in the folder; the restarted node resumed where it
stopped; no honest file was rejected; no temporary file is left. The table (and ``summary.json`` under
``--out``) gives, per fault, trials run, trials survived and submissions lost.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hostile_mix import CLASSES  # noqa: E402
from trials import (  # noqa: E402
    COORDINATOR_POINTS,
    ROUNDS,
    WORKER_POINTS,
    WORKERS,
    run_kill_trial,
    run_mixed_trial,
    run_oserror_trial,
)

PUBLISH = ("generation", "stage", "round")
KINDS = ("worker", "coordinator", "oserror", "mixed")
ASYNC_COORDINATOR_POINTS = ("state", "random")


def mixed_trial(rng: random.Random, tmp: Path, classes: list[str], round_mode: str = "sync") -> dict:
    """One mixed trial (a hostile class and a kill); its record, with the four counts of issue 14."""
    cls, seed = rng.choice(classes), rng.randrange(2**31)
    try:
        r = run_mixed_trial(tmp, cls, seed, round_mode=round_mode)
    except Exception:  # noqa: BLE001 - a broken trial is reported, and the run goes on
        return {
            "fault": f"mixed: {cls}",
            "ok": False,
            "lost": None,
            "seed": seed,
            "error": traceback.format_exc()[-2000:],
        }
    error = "; ".join([*r.crashes, *r.unable_to_restart, *r.problems])[:4000]
    if r.early_exits:
        error = f"early exits: {r.early_exits}; {error}"
    if r.outside_bytes:
        error = f"{r.outside_bytes} bytes written outside the folder; {error}"
    planted = "not planted" not in r.planted  # a trial whose hostile file never landed proved nothing
    if not planted:
        error = f"{r.planted}; {error}"
    return {
        "fault": f"mixed: {cls}",
        "planted": r.planted,
        "victim": r.victim,
        "kill_round": r.kill_round,
        "plant_round": r.plant_round,
        "seed": seed,
        "ok": r.ok and planted,
        "crashes": len(r.crashes),
        "lost": r.lost,
        "outside_bytes": r.outside_bytes,
        "early_exits": len(r.early_exits),
        "unable_to_restart": len(r.unable_to_restart),
        "seconds": round(r.seconds, 1),
        **({"error": error} if not (r.ok and planted) else {}),
    }


def one_trial(kind: str, rng: random.Random, tmp: Path, round_mode: str = "sync") -> dict:
    """Run one randomised trial; returns its record (``ok`` False with the reason when a property failed)."""
    seed = rng.randrange(2**31)
    mode = {"round_mode": round_mode}
    if kind == "worker":
        point, round_ = rng.choice(WORKER_POINTS), rng.randrange(ROUNDS - 1)
        victim, publish = rng.choice(WORKERS), rng.choice(PUBLISH)
        record = {"fault": f"worker SIGKILL mid {point}", "victim": victim, "round": round_, "publish": publish}
        run = lambda: run_kill_trial(tmp, victim, point, round_, publish, seed, **mode)  # noqa: E731
    elif kind == "coordinator":
        # An async coordinator writes its state at the start and at the finish only, and no round of its own.
        point = rng.choice(COORDINATOR_POINTS if round_mode == "sync" else ASYNC_COORDINATOR_POINTS)
        round_ = rng.randrange(1, ROUNDS + 1) if point == "state" else rng.randrange(ROUNDS - 1)
        round_ = ROUNDS if point == "state" and round_mode == "async" else round_
        record = {"fault": f"coordinator SIGKILL mid {point}", "victim": "coord", "round": round_}
        run = lambda: run_kill_trial(tmp, "coord", point, round_, "stage", seed, **mode)  # noqa: E731
    else:
        record = {"fault": "EIO/ENOTCONN bursts (local backend)"}
        run = lambda: run_oserror_trial(tmp, seed, **mode)  # noqa: E731
    record["seed"] = seed
    started = time.monotonic()
    try:
        result = run()
        record.update(ok=True, lost=getattr(result, "lost", 0))
        if kind == "oserror":
            record["injected"] = dict(result)
        else:
            record["resumed_at"] = result.resumed_at
    except AssertionError as exc:
        record.update(ok=False, lost=None, error=str(exc)[:2000])
    except Exception:  # noqa: BLE001 - a broken trial is reported, and the run goes on
        record.update(ok=False, lost=None, error=traceback.format_exc()[-2000:])
    record["seconds"] = round(time.monotonic() - started, 1)
    return record


COUNTS = ("lost", "crashes", "outside_bytes", "early_exits", "unable_to_restart")


def summarise(records: list[dict]) -> list[dict]:
    rows: dict[str, dict] = {}
    for r in records:
        row = rows.setdefault(
            r["fault"], {"fault": r["fault"], "trials": 0, "survived": 0, "seconds": 0.0, **dict.fromkeys(COUNTS, 0)}
        )
        row["trials"] += 1
        row["survived"] += bool(r["ok"])
        for key in COUNTS:
            row[key] += r.get(key) or 0
        row["seconds"] += r.get("seconds", 0.0)
    return sorted(rows.values(), key=lambda row: row["fault"])


def table(rows: list[dict]) -> str:
    head = "| fault | trials | survived | submissions lost | crashes | bytes outside | early exits | unable to restart "
    lines = [head + "| mean s |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        counts = " | ".join(str(row[k]) for k in COUNTS)
        mean = row["seconds"] / row["trials"]
        lines.append(f"| {row['fault']} | {row['trials']} | {row['survived']} | {counts} | {mean:.1f} |")
    totals = " | ".join(str(sum(r[k] for r in rows)) for k in COUNTS)
    lines.append(f"| **all** | {sum(r['trials'] for r in rows)} | {sum(r['survived'] for r in rows)} | {totals} | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20, help="trials of each kind (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random choices (default 0)")
    parser.add_argument("--kinds", default="worker,coordinator,oserror", help=f"comma-separated, of {','.join(KINDS)}")
    parser.add_argument(
        "--classes", default=",".join(CLASSES), help="mixed trials: the hostile classes to draw from (default: all)"
    )
    parser.add_argument(
        "--round-mode", choices=("sync", "async"), default="sync", help="the coordinator's ROUND_MODE (default sync)"
    )
    parser.add_argument("--out", type=Path, default=None, help="folder for trials.jsonl, summary.json, summary.md")
    parser.add_argument("--keep", action="store_true", help="keep the folders of failed trials (printed)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the end-of-trial readers' rejections would crowd the progress lines
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"--kinds: unknown {sorted(unknown)}; use {', '.join(KINDS)}")
    classes = [c for c in args.classes.split(",") if c]
    if set(classes) - set(CLASSES) or not classes:
        parser.error(f"--classes: unknown {sorted(set(classes) - set(CLASSES))}; use {', '.join(CLASSES)}")
    rng = random.Random(args.seed)
    records = []
    progress = None
    if args.out:  # each trial's record as it ends: a run stopped midway keeps what it ran
        args.out.mkdir(parents=True, exist_ok=True)
        progress = (args.out / "trials.jsonl").open("w")
    for kind in kinds:
        for i in range(args.trials):
            tmp = Path(tempfile.mkdtemp(prefix=f"fault-{kind}-{i}-"))
            if kind == "mixed":
                record = mixed_trial(rng, tmp, classes, args.round_mode)
            else:
                record = one_trial(kind, rng, tmp, args.round_mode)
            records.append(record)
            if progress is not None:
                progress.write(json.dumps(record) + "\n")
                progress.flush()
            status = "ok  " if record["ok"] else "FAIL"
            detail = {k: v for k, v in record.items() if k not in ("fault", "ok", "error", "injected", *COUNTS)}
            print(f"{status} {kind} {i + 1}/{args.trials}: {record['fault']} {detail}", flush=True)
            if not record["ok"]:
                print("     " + record["error"].splitlines()[0][:300] + (f"\n     kept {tmp}" if args.keep else ""))
            if record["ok"] or not args.keep:
                shutil.rmtree(tmp, ignore_errors=True)
    rows = summarise(records)
    print()
    print(table(rows))
    if progress is not None:
        progress.close()
        summary = {"seed": args.seed, "round_mode": args.round_mode, "rows": rows}
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
        (args.out / "summary.md").write_text(table(rows) + "\n")
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
