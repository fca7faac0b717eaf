"""Run a coordinator and workers (synthetic workload) on a lagged mount and print the run's figures.

    python tests/lagged/run_lagged_swarm.py --max-lag 120 --min-lag 5 --rounds 4 --seed 1 --out /tmp/lag120

Every node sees the others' changes ``--min-lag``..``--max-lag`` seconds late (``--spread``: each node its own
upper bound, see ``lagged_swarm.spread_lags``). The nodes get ``SYNC_LAG`` = the largest bound unless
``--sync-lag`` says otherwise (``--sync-lag 0`` runs them with the plain defaults, as before SYNC_LAG existed);
``--set VAR=value`` gives every node an explicit variable; ``--round-mode async`` gives the coordinator
ROUND_MODE=async (each worker plays its own rounds; the figures then say each worker's seconds per round, the
workers done, and the age and staleness of the external groups taken). ``--out`` keeps the replicas, every node's output
(nodes.log), the syncer's record (mount.json) and the figures (figures.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lagged_mount import Lag  # noqa: E402
from lagged_swarm import COORDINATOR, SwarmSpec, run, spread_lags  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--transplants", type=int, default=2, help="J")
    parser.add_argument("--min-lag", type=float, default=1.0)
    parser.add_argument("--max-lag", type=float, default=120.0)
    parser.add_argument("--spread", action="store_true", help="each node its own upper bound (seeded)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--step", type=float, default=1.0, help="SYNTHETIC_STEP_SECONDS: work per round")
    parser.add_argument("--sync-lag", type=float, default=None, help="SYNC_LAG for the nodes (default: --max-lag)")
    parser.add_argument("--set", action="append", default=[], metavar="VAR=value")
    parser.add_argument("--round-mode", choices=("sync", "async"), default="sync", help="the coordinator's ROUND_MODE")
    parser.add_argument("--timeout", type=float, default=3 * 3600)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    names = [COORDINATOR] + [f"w{i}" for i in range(1, args.workers + 1)]
    if args.spread:
        lags = spread_lags(args.workers, args.min_lag, args.max_lag, args.seed)
    else:
        lags = {n: Lag(args.min_lag, args.max_lag) for n in names}
    spec = SwarmSpec(
        lags=lags,
        seed=args.seed,
        rounds=args.rounds,
        transplants=args.transplants,
        step_seconds=args.step,
        sync_lag=args.sync_lag,
        env=dict(item.split("=", 1) for item in args.set),
        timeout=args.timeout,
        round_mode=args.round_mode,
    )
    out = args.out or Path(tempfile.mkdtemp(prefix="lagged-swarm-"))
    outcome = run(spec, out, progress=True)
    figures = outcome.figures()
    print(json.dumps({k: v for k, v in figures.items() if k != "mount"}, indent=1, default=str))
    mount = figures["mount"]
    print(
        f"mount: {mount['outcomes']}, temporaries shown {mount['temporaries_shown']}, reordered {mount['reordered']}, "
        f"deletions {mount['deletions_delivered']}, errors {len(mount['errors'])}"
    )
    for node, d in mount["per_destination"].items():
        print(
            f"  to {node}: lag {d['lag']}, delivered {d['delivered']}, delay p50 {d['delay_p50']} "
            f"p90 {d['delay_p90']} max {d['delay_max']}"
        )
    print(f"files in {out}")
    return 0 if all(code == 0 for code in outcome.codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
