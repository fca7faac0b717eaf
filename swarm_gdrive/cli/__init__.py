"""The ``swarm-gdrive`` command: ``run`` one node, ``env`` the variables, ``demo`` a small local swarm, ``memory`` the
memory a worker needs, and the reading commands ``report``, ``compare``, ``status``, ``validate`` and ``dashboard``.

Every command's parser and entry point lives in this package (:mod:`.demo`, :mod:`.memory`, :mod:`.readers`); what
they call does the work: the launcher runs a node, :mod:`swarm_gdrive.observe` reads experiments and draws.
"""

from __future__ import annotations

import argparse
import gc
import sys

from swarm_gdrive.cli.demo import add_demo_parser, demo_env, demo_main
from swarm_gdrive.cli.memory import add_memory_parser, memory_main
from swarm_gdrive.cli.readers import (
    add_compare_parser,
    add_dashboard_parser,
    add_report_parser,
    add_status_parser,
    add_validate_parser,
    compare_main,
    dashboard_main,
    report_main,
    status_main,
    validate_main,
)
from swarm_gdrive.config import env_fields, settings_markdown

__all__ = ["build_parser", "demo_env", "main"]


def run_main(_args: argparse.Namespace) -> int:
    from swarm_gdrive.launcher import run_node

    return run_node(own_process=True)


def env_main(args: argparse.Namespace) -> int:
    if args.markdown:
        print(settings_markdown(), end="")
        return 0
    for f in env_fields():
        default = "(required)" if f.metadata["env"] == "GDRIVE_PATH" else repr(f.default)
        print(f"{f.metadata['env']:<28} default {default}\n    {f.metadata['help']}")
    return 0


#: Each command's entry point: it returns the exit code.
HANDLERS = {
    "run": run_main,
    "env": env_main,
    "memory": memory_main,
    "demo": demo_main,
    "report": report_main,
    "compare": compare_main,
    "status": status_main,
    "validate": validate_main,
    "dashboard": dashboard_main,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swarm-gdrive",
        description="Train small language models together through a shared folder (GRPO + SAPO). "
        "Try 'swarm-gdrive demo' for a small local swarm; 'swarm-gdrive env' lists every setting.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="run one node; configured by environment variables (see: swarm-gdrive env)")
    env = sub.add_parser("env", help="list every environment variable with its default and meaning")
    env.add_argument("--markdown", action="store_true", help="as the Markdown table of docs/settings.md")
    add_demo_parser(sub)
    add_memory_parser(sub)
    add_report_parser(sub)
    add_compare_parser(sub)
    add_status_parser(sub)
    add_validate_parser(sub)
    add_dashboard_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from swarm_gdrive.storage import StorageError

    try:
        code = HANDLERS[args.command](args)
    except StorageError as exc:  # no credentials, or a backend refusing the location: one line, not a traceback
        print(f"swarm-gdrive: error: {exc}", file=sys.stderr)
        sys.exit(2)
    if argv is None:  # the command's own process, about to exit (not a caller's): as a node does (launcher.main),
        gc.freeze()  # no last collection over every object torch made, once the work is done
    sys.exit(code)
