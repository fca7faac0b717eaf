"""The reading commands: ``status``, ``validate``, ``report``, ``compare`` and ``dashboard``.

Each reads an experiment of the shared folder (``--folder``, else GDRIVE_PATH) and never writes to it; the reading
and the drawing are :mod:`swarm_gdrive.observe`'s, this module only turns the command line into their arguments and
their results into lines and an exit code.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from swarm_gdrive.observe.monitor import (
    _state_summary,
    checks,
    findings,
    load,
    status_table,
    unknown_experiments_message,
)
from swarm_gdrive.observe.web import REFRESH_S, Pages, make_server


def add_reader_arguments(parser: argparse.ArgumentParser) -> None:
    """--folder and --experiment, which :func:`reader_config` reads."""
    parser.add_argument("--folder", help="the shared folder (default: GDRIVE_PATH)")
    parser.add_argument("--experiment", help="experiment name (default: EXPERIMENT_NAME)")


def reader_config(args: argparse.Namespace, check_known: bool = True):
    """(config, storage) for a reading command (status, validate, report, compare, dashboard) from ``--folder``
    / ``--experiment`` and the environment; (None, None) after printing a bad variable's error, a storage that
    cannot be opened, or (``check_known``) an experiment the folder does not hold."""
    from swarm_gdrive.config import ConfigError, from_env
    from swarm_gdrive.storage import StorageError, storage_for

    env = {"GDRIVE_PATH": args.folder} if args.folder else {}
    if getattr(args, "experiment", None):
        env["EXPERIMENT_NAME"] = args.experiment
    try:
        config = from_env({**os.environ, **env, "NODE_ROLE": "coordinator"})  # a reader: no model, no tasks
    except ConfigError as exc:
        print(f"swarm-gdrive: error: {exc}", file=sys.stderr)
        return None, None
    try:
        storage = storage_for(config)
    except StorageError as exc:
        print(f"swarm-gdrive: error: {exc}", file=sys.stderr)
        return None, None
    if not check_known:
        return config, storage
    named = [*getattr(args, "experiments", []), getattr(args, "baseline", None)]  # compare names several
    wanted = [name for name in dict.fromkeys(named) if name] or [config.experiment_name]
    unknown = unknown_experiments_message(storage, wanted, config.gdrive_path)
    if unknown:
        print(f"swarm-gdrive: error: {unknown}", file=sys.stderr)
        return None, None
    return config, storage


def add_report_parser(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser("report", help="CSVs, PNG plots and an HTML page of an experiment (reads only)")
    parser.add_argument("--out", required=True, help="folder to write the report into")
    add_reader_arguments(parser)
    return parser


def report_main(args: argparse.Namespace) -> int:
    from swarm_gdrive.observe.report import write_report

    config, storage = reader_config(args)
    if config is None:
        return 2
    for file in write_report(storage, config.experiment_name, Path(args.out)):
        print(file)
    return 0


def add_compare_parser(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser("compare", help="configurations of a study against a baseline (cumulative reward, eval)")
    parser.add_argument("experiments", nargs="+", help="experiment names in the shared folder")
    parser.add_argument("--baseline", required=True, help="the experiment every other one is compared with")
    parser.add_argument("--rounds", type=int, help="compare over the first N rounds (default: all common rounds)")
    parser.add_argument("--folder", help="the shared folder (default: GDRIVE_PATH)")
    parser.add_argument("--plot", help="also write a PNG overlaying the experiments' reward and pass@1 here")
    return parser


def compare_main(args: argparse.Namespace) -> int:
    from swarm_gdrive.observe.analysis import compare, format_table

    config, storage = reader_config(args)
    if config is None:
        return 2
    print(format_table(compare(storage, args.experiments, args.baseline, args.rounds)))
    if args.plot:
        from swarm_gdrive.observe.plots import experiments_overlay

        names = list(dict.fromkeys([args.baseline, *args.experiments]))
        figure = experiments_overlay({name: load(storage, name) for name in names})
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(args.plot, dpi=100)
        print(f"wrote {args.plot}")
    return 0


def add_status_parser(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser("status", help="the experiment now: workers, heartbeats, rewards, findings (reads only)")
    add_reader_arguments(parser)
    parser.add_argument(
        "--watch", type=float, metavar="SECONDS", help="show it again every SECONDS until Ctrl-C (a live view)"
    )
    return parser


def status_main(args: argparse.Namespace) -> int:
    watch = getattr(args, "watch", None)
    if watch is not None and not watch > 0:
        print(f"swarm-gdrive: error: --watch={watch:g}: use a number of seconds > 0", file=sys.stderr)
        return 2
    config, storage = reader_config(args)
    if config is None:
        return 2
    terminal = sys.stdout.isatty()
    try:
        while True:
            snapshot = load(storage, config.experiment_name, liveness_timeout=config.liveness_timeout)
            if watch is not None:  # a terminal is redrawn in place; a log or a pipe gets a dated rule each time
                print("\033[H\033[2J", end="") if terminal else print(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')}")
            print(_state_summary(snapshot))
            print(status_table(snapshot))
            print()
            for finding in findings(snapshot, config.liveness_timeout):
                print(f"{finding.severity.upper():<7} {finding.code}: {finding.message}")
            if watch is None:
                return 0
            print(f"\n(every {watch:g} s; Ctrl-C stops)", flush=True)
            time.sleep(watch)
    except KeyboardInterrupt:
        if watch is None:
            raise
        return 0


def add_validate_parser(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser("validate", help="check a finished TEST_MODE run; exit 1 when a check fails (reads only)")
    parser.add_argument("--rounds", type=int, required=True, help="rounds the run should have completed")
    parser.add_argument("--nodes", type=int, required=True, help="workers that should have registered")
    parser.add_argument("--transplants", type=int, default=0, help="J: also check rollouts and external groups")
    add_reader_arguments(parser)
    return parser


def validate_main(args: argparse.Namespace) -> int:
    config, storage = reader_config(args)
    if config is None:
        return 2
    snapshot = load(storage, config.experiment_name)
    failed = 0
    for name, failures in checks(snapshot, args.rounds, args.nodes, args.transplants):
        print(f"{'PASS' if not failures else 'FAIL'} {name}")
        for msg in failures:
            print(f"     {msg}")
        failed += bool(failures)
    print(f"{'all checks passed' if not failed else f'{failed} check(s) failed'}")
    return 0 if not failed else 1


def add_dashboard_parser(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser("dashboard", help="a local web page that follows the folder's experiments (reads only)")
    parser.add_argument("--folder", help="the shared folder (default: GDRIVE_PATH)")
    parser.add_argument("--experiment", help="the experiment shown first (default: EXPERIMENT_NAME, else the first)")
    parser.add_argument("--port", type=int, default=8080, help="port (default 8080, as the original project's UI)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    parser.add_argument("--refresh", type=float, default=REFRESH_S, help="seconds between the page's refreshes")
    return parser


def dashboard_main(args: argparse.Namespace) -> int:
    if not args.refresh > 0:
        print(f"swarm-gdrive: error: --refresh={args.refresh:g}: use a number of seconds > 0", file=sys.stderr)
        return 2
    config, storage = reader_config(args, check_known=False)  # an experiment may appear while it runs
    if config is None:
        return 2
    pages = Pages(storage, config.experiment_name, args.refresh, config.liveness_timeout)
    try:
        server = make_server(pages, args.host, args.port)
    except OSError as exc:
        print(f"swarm-gdrive: error: --port={args.port}: cannot listen there ({exc}): choose another", file=sys.stderr)
        return 2
    url = f"http://{args.host}:{server.server_address[1]}/"
    print(f"dashboard of {config.gdrive_path} on {url} (Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
