"""Issue #28: synchronous against asynchronous rounds (ROUND_MODE), both modes in one invocation, one figure at a time.

Figures (``--figure``):

- ``hetero``: a coordinator and two workers as threads of this process on a local folder, synthetic workload, one
  with SYNTHETIC_STEP_SECONDS=1 (fast), one with 15 (slow), J=1, the package's defaults otherwise. Sync plays
  ``--slow-rounds`` rounds; async runs until the slow worker has submitted that many rounds, then every node is
  stopped. Figures: the fast worker's busy fraction (its generate + train time over the span from its first round's
  start to its last round's end), its rounds a minute, the slow worker's groups the fast one trained on per slow
  round, and external groups received / asked per worker.
- ``lagged``: a coordinator and three worker processes on the lagged-mount double (``tests/lagged``: each node on
  its own replica, changes reaching the others ``--min-lag``..``--max-lag`` s late), ~1 s of work a round,
  SYNC_LAG = the largest lag. The modes run side by side (at the same time: the nodes mostly sleep): sync plays
  ``--sync-rounds`` rounds; async plays up to ``--async-rounds`` and is stopped when the sync run ends. Optionally
  (``--sync-defaults``) a third run, sync with SYNC_LAG=0. Figures: seconds per worker round (start to start),
  external groups received / asked in the rounds that started after the largest lag, median staleness (async).
- ``drive``: ``bench/coordination.py``'s harness (counted backends, the Drive emulator with a latency per request),
  N workers, J; Drive requests per worker round (between the starts of two of its consecutive rounds, round 0 left
  out), in each mode.

Everything is read back from the run's own files (``logs/<node>/metrics.jsonl`` and ``training_events.jsonl``) by
the pure functions below, which ``tests/unit/test_bench_rounds.py`` checks on hand-made lines.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from bench.common import finite, machine_info, machine_line, machine_tag, markdown_table, source_version, write_result

TESTS_DIR = Path(__file__).resolve().parent.parent / "tests"
EXPERIMENT = "rounds"
MODES = ("sync", "async")

# -- figures from a run's files (pure) ----------------------------------------------------------------------------


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a log file, one a line; a partial or foreign line is skipped (as readers do)."""
    return parse_jsonl(path.read_bytes()) if path.exists() else []


def parse_jsonl(data: bytes) -> list[dict[str, Any]]:
    """The JSON objects of a log's bytes, one a line; a partial or foreign line is skipped."""
    out = []
    for line in data.decode(errors="replace").splitlines():
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def round_spans(metrics: list[dict[str, Any]]) -> dict[int, tuple[float, float]]:
    """round -> (start, end) in epoch seconds, from the round lines (``round/seconds``, written as the round ends)."""
    spans = {}
    for m in metrics:
        seconds = m.get("values", {}).get("round/seconds")
        if seconds is not None and m.get("round") is not None:
            spans[int(m["round"])] = (m["ts"] - seconds, m["ts"])
    return spans


def stage_lines(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stage lines (those with ``swarm/external_requested``), each a round's stage."""
    return [m for m in metrics if "swarm/external_requested" in m.get("values", {})]


def busy(metrics: list[dict[str, Any]]) -> dict[str, float | int | None]:
    """A worker's busy fraction: sum of ``time/generate_s`` + ``time/train_s`` of its stages in whole rounds, over
    (last round's end - first round's start); and its rounds a minute over the same span."""
    spans = round_spans(metrics)
    if not spans:
        return {"rounds": 0, "busy_s": None, "span_s": None, "busy_fraction": None, "rounds_per_min": None}
    work = sum(
        m["values"].get("time/generate_s", 0.0) + m["values"].get("time/train_s", 0.0)
        for m in stage_lines(metrics)
        if m.get("round") in spans
    )
    span = max(end for _, end in spans.values()) - min(start for start, _ in spans.values())
    return {
        "rounds": len(spans),
        "busy_s": work,
        "span_s": span,
        "busy_fraction": work / span if span > 0 else None,
        "rounds_per_min": 60 * len(spans) / span if span > 0 else None,
    }


def external_fill(metrics: list[dict[str, Any]], started_after: float | None = None) -> dict[str, int | float | None]:
    """External groups received (``swarm/external_used``) and asked for (``swarm/external_requested``) over the stages
    of whole rounds; with ``started_after``, only rounds that started at or after that time."""
    spans = round_spans(metrics)
    used = asked = 0
    for m in stage_lines(metrics):
        span = spans.get(m.get("round"))
        if span is None or (started_after is not None and span[0] < started_after):
            continue
        used += int(m["values"]["swarm/external_used"])
        asked += int(m["values"]["swarm/external_requested"])
    return {"received": used, "asked": asked, "fraction": used / asked if asked else None}


def taken(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every external group of the ``externals_taken`` events, one dict each (source, source_round, age_s,
    staleness_rounds, and the receiver's round)."""
    out = []
    for e in events:
        if e.get("event") != "externals_taken":
            continue
        d = e.get("data", {})
        for source, source_round, age, stale in zip(
            d["sources"], d["source_rounds"], d["age_s"], d["staleness_rounds"], strict=True
        ):
            out.append(
                {"round": e.get("round"), "source": source, "source_round": source_round, "age_s": age, "stale": stale}
            )
    return out


def staleness(groups: list[dict[str, Any]]) -> dict[str, float | int | None]:
    """Median and 90th percentile of the taken groups' age (s) and staleness (receiver's rounds)."""
    ages = sorted(g["age_s"] for g in groups)
    rounds = sorted(g["stale"] for g in groups)
    return {
        "groups": len(groups),
        "age_s_median": statistics.median(ages) if ages else None,
        "age_s_p90": _quantile(ages, 0.9),
        "age_s_max": ages[-1] if ages else None,
        "rounds_median": statistics.median(rounds) if rounds else None,
        "rounds_max": rounds[-1] if rounds else None,
    }


def _quantile(ordered: list[float], q: float) -> float | None:
    """The nearest-rank quantile of sorted values."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def groups_per_source_round(groups: list[dict[str, Any]], source: str, source_rounds: Iterable[int]) -> dict[int, int]:
    """For each of ``source``'s rounds: how many of its groups the receiver took (0 when none)."""
    counts = dict.fromkeys(source_rounds, 0)
    for g in groups:
        if g["source"] == source and g["source_round"] in counts:
            counts[g["source_round"]] += 1
    return counts


def start_to_start(metrics: list[dict[str, Any]]) -> float | None:
    """Mean seconds between the starts of a worker's consecutive rounds (its cadence: waits included)."""
    starts = [start for _, (start, _) in sorted(round_spans(metrics).items())]
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    return statistics.fmean(gaps) if gaps else None


def node_logs(folder: Path, node: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(metrics, events) of ``node`` in the shared folder ``folder`` (``Layout``'s paths)."""
    from swarm_gdrive.protocol.layout import Layout

    layout = Layout(EXPERIMENT)
    return read_jsonl(folder / layout.metrics_file(node)), read_jsonl(folder / layout.events_file(node))


# -- figure 1: heterogeneous speeds on a local folder -----------------------------------------------------------


def _threads_node() -> type:
    if str(TESTS_DIR) not in sys.path:
        sys.path.insert(0, str(TESTS_DIR))
    from swarm_threads import Node

    return Node


def hetero_run(mode: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """One heterogeneous-speed swarm (fast and slow worker) in ``mode``; its figures."""
    node_cls = _threads_node()
    shared = folder / "shared"
    shared.mkdir(parents=True)
    env = {
        "GDRIVE_PATH": str(shared),
        "EXPERIMENT_NAME": EXPERIMENT,
        "SWARM_LOCAL_DIR": str(folder / "local"),
        "WORKLOAD": "synthetic",
        "SEED": str(args.seed),
        "MIN_WORKERS": "2",
        "NUM_TRANSPLANT_TREES": "1",
        "NUM_TRAIN_SAMPLES": "4",
        "NUM_GENERATIONS": "4",
        # async: the slow worker's rounds end the run (every node stopped then); sync: MAX_ROUNDS does
        "MAX_ROUNDS": str(args.slow_rounds if mode == "sync" else 100_000),
    }
    steps = {"fast": args.fast_step, "slow": args.slow_step}
    nodes = [node_cls({**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord", "ROUND_MODE": mode})]
    nodes += [
        node_cls({**env, "NODE_ROLE": "worker", "NODE_ID": w, "SYNTHETIC_STEP_SECONDS": str(s)})
        for w, s in steps.items()
    ]
    from swarm_gdrive.protocol.layout import Layout

    last_slow = shared / Layout(EXPERIMENT).reward_file(args.slow_rounds - 1, 0, "slow")
    started = time.monotonic()
    for n in nodes:
        n.start()
    deadline = started + args.timeout
    while any(n.is_alive() for n in nodes) and time.monotonic() < deadline:
        if mode == "async" and last_slow.exists():
            break
        time.sleep(0.2)
    for n in nodes:  # all at once, as stop_all does: a clean stop of every node
        n.stop.set()
    for n in nodes:
        n.join(60)
    wall = time.monotonic() - started
    fast_m, fast_e = node_logs(shared, "fast")
    slow_m, _ = node_logs(shared, "slow")
    slow_rounds = sorted(round_spans(slow_m))[: args.slow_rounds]
    if mode == "async":
        per_slow = groups_per_source_round(taken(fast_e), "slow", slow_rounds)
    else:  # sync: the fast worker's only peer is the slow one, and each round's groups are that round's
        per_slow = {r: 0 for r in slow_rounds}
        for m in stage_lines(fast_m):
            if m["round"] in per_slow:
                per_slow[m["round"]] += int(m["values"]["swarm/external_used"])
    return {
        "mode": mode,
        "wall_s": wall,
        "exit_codes": {n.config.node_id: n.code for n in nodes},
        "fast": busy(fast_m),
        "slow": busy(slow_m),
        "slow_rounds": len(slow_rounds),
        "slow_groups_to_fast_per_slow_round": per_slow,
        "slow_groups_to_fast_mean": statistics.fmean(per_slow.values()) if per_slow else None,
        "slow_rounds_reaching_fast": sum(1 for v in per_slow.values() if v >= 1),
        "external": {"fast": external_fill(fast_m), "slow": external_fill(slow_m)},
        "staleness_fast": staleness(taken(fast_e)),
    }


def hetero(args: argparse.Namespace) -> dict[str, Any]:
    runs = {}
    for mode in MODES:
        with tempfile.TemporaryDirectory(prefix=f"bench-rounds-hetero-{mode}-") as tmp:
            runs[mode] = hetero_run(mode, args, Path(tmp))
        _say(f"hetero {mode}: {runs[mode]['wall_s']:.0f} s, fast busy {runs[mode]['fast']['busy_fraction']}")
    targets = [
        _target("fast worker's busy fraction", runs, lambda r: r["fast"]["busy_fraction"], ">=", 0.8),
        _target(
            "slow groups reaching the fast worker per slow round (mean)",
            runs,
            lambda r: r["slow_groups_to_fast_mean"],
            ">=",
            1,
        ),
        _target(
            "slow rounds none of whose groups reached the fast worker",
            runs,
            lambda r: r["slow_rounds"] - r["slow_rounds_reaching_fast"],
            "<=",
            0,
        ),
    ]
    return {
        "settings": _settings(args, ("fast_step", "slow_step", "slow_rounds", "seed")),
        "runs": runs,
        "targets": targets,
    }


def render_hetero(result: dict[str, Any]) -> list[str]:
    rows = []
    for mode, r in result["runs"].items():
        ext = r["external"]
        rows.append(
            [
                mode,
                r["wall_s"],
                r["fast"]["rounds"],
                r["slow_rounds"],
                r["fast"]["busy_fraction"],
                r["fast"]["rounds_per_min"],
                r["slow_groups_to_fast_mean"],
                f"{r['slow_rounds_reaching_fast']}/{r['slow_rounds']}",
                f"{ext['fast']['received']}/{ext['fast']['asked']}",
                f"{ext['slow']['received']}/{ext['slow']['asked']}",
                r["staleness_fast"]["age_s_median"],
            ]
        )
    header = [
        "mode", "wall s", "fast rounds", "slow rounds", "fast busy", "fast rounds/min",
        "slow groups to fast per slow round", "slow rounds reaching fast", "fast: external got/asked",
        "slow: external got/asked", "fast: median age of externals (s)",
    ]  # fmt: skip
    return [markdown_table(header, rows)]


# -- figure 2: lagged replicas ----------------------------------------------------------------------------------


def _lagged() -> Any:
    for p in (TESTS_DIR / "lagged", TESTS_DIR):
        if str(p) not in sys.path:
            sys.path.insert(0, str(p))
    import lagged_swarm

    return lagged_swarm


def pooled_fill(fills: Iterable[dict[str, Any]]) -> dict[str, int | float | None]:
    """Several workers' :func:`external_fill` added up."""
    fills = list(fills)
    received, asked = sum(f["received"] for f in fills), sum(f["asked"] for f in fills)
    return {"received": received, "asked": asked, "fraction": received / asked if asked else None}


def lagged_figures(replicas: Path, workers: list[str], launched: float, lag: float, experiment: str) -> dict[str, Any]:
    """The lagged figures of one run from each worker's own replica. External groups are counted in the rounds that
    started ``lag`` s after the launch (the issue's "once the first lag has passed"), and also in those that started
    ``lag`` s after the last worker's first round (every worker playing, its first batches given time to arrive)."""
    from swarm_gdrive.protocol.layout import Layout

    layout = Layout(experiment)
    logs = {
        w: (read_jsonl(replicas / w / layout.metrics_file(w)), read_jsonl(replicas / w / layout.events_file(w)))
        for w in workers
    }
    firsts = [min(start for start, _ in round_spans(m).values()) for m, _ in logs.values() if round_spans(m)]
    all_playing = max(firsts) if firsts else launched
    per = {
        w: {
            "rounds": len(round_spans(metrics)),
            "start_to_start_s": start_to_start(metrics),
            "external_after_lag": external_fill(metrics, launched + lag),
            "external_after_all_playing_plus_lag": external_fill(metrics, all_playing + lag),
            "external_all": external_fill(metrics),
        }
        for w, (metrics, _) in logs.items()
    }
    cadences = [p["start_to_start_s"] for p in per.values() if p["start_to_start_s"] is not None]
    return {
        "per_worker": per,
        "worker_rounds": sum(p["rounds"] for p in per.values()),
        "first_round_started_s": [round(f - launched, 1) for f in firsts],
        "seconds_per_worker_round": statistics.fmean(cadences) if cadences else None,
        "external_after_lag": pooled_fill(p["external_after_lag"] for p in per.values()),
        "external_after_all_playing_plus_lag": pooled_fill(
            p["external_after_all_playing_plus_lag"] for p in per.values()
        ),
        "external_all": pooled_fill(p["external_all"] for p in per.values()),
        "staleness": staleness([g for _, events in logs.values() for g in taken(events)]),
    }


def lagged(args: argparse.Namespace) -> dict[str, Any]:
    ls = _lagged()
    from lagged_mount import Lag

    names = [ls.COORDINATOR] + [f"w{i}" for i in range(1, args.workers + 1)]
    lags = {n: Lag(args.min_lag, args.max_lag) for n in names}
    kept = {"transplants": args.transplants, "timeout": args.timeout}
    specs = {
        "sync": ls.SwarmSpec(lags, args.seed, rounds=args.sync_rounds, **kept),
        "async": ls.SwarmSpec(lags, args.seed, rounds=args.async_rounds, env={"ROUND_MODE": "async"}, **kept),
    }
    if args.sync_defaults:
        specs["sync, SYNC_LAG=0"] = ls.SwarmSpec(lags, args.seed, rounds=args.sync_rounds, sync_lag=0.0, **kept)
    outcomes: dict[str, Any] = {}
    launched: dict[str, float] = {}
    root = Path(tempfile.mkdtemp(prefix="bench-rounds-lagged-"))

    errors: dict[str, str] = {}
    walls: dict[str, float] = {}

    def one(name: str) -> None:
        launched[name] = time.time()
        try:
            outcomes[name] = ls.run(specs[name], root / _dirname(name))
        except Exception as exc:  # noqa: BLE001 - the run's files are still there; the figures come from them
            errors[name] = f"{type(exc).__name__}: {exc}"
        walls[name] = time.time() - launched[name]
        if name == "sync":  # the async run ends with the sync one: the same wall time
            for other in specs:
                if specs[other].env.get("ROUND_MODE") == "async":
                    specs[other].timeout = min(specs[other].timeout, time.time() - launched[other])

    threads = [threading.Thread(target=one, args=(name,), daemon=True) for name in specs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    runs = {}
    for name, spec in specs.items():
        outcome = outcomes.get(name)
        # The harness's own figures read sync closes (an async finish has no round fields): sync runs only.
        figures = outcome.figures() if outcome is not None and "ROUND_MODE" not in spec.env else {}
        runs[name] = {
            "wall_s": walls[name],
            "sync_lag": spec.declared_lag,
            "harness_error": errors.get(name),
            "exit_codes": None if outcome is None else outcome.codes,
            "state": figures.get("state"),
            "coordinator_round_seconds_mean": figures.get("round_seconds_mean"),
            "closed_on_deadline": figures.get("closed_on_deadline"),
            "skipped": figures.get("skipped"),
            **lagged_figures(
                root / _dirname(name) / "replicas", spec.workers, launched[name], args.max_lag, ls.EXPERIMENT
            ),
        }
        _say(f"lagged {name}: {walls[name]:.0f} s, {runs[name]['seconds_per_worker_round']} s a worker round")
    bound = args.max_lag + (runs["async"]["seconds_per_worker_round"] or 0.0)
    targets = [
        _target("seconds per worker round", runs, lambda r: r["seconds_per_worker_round"], "<=", 3),
        _target(
            "external received / asked, rounds started after the largest lag",
            runs,
            lambda r: r["external_after_lag"]["fraction"],
            ">=",
            0.95,
        ),
        _target("median age of external groups (s)", runs, lambda r: r["staleness"]["age_s_median"], "<=", bound),
    ]
    return {
        "settings": _settings(
            args,
            ("workers", "min_lag", "max_lag", "transplants", "sync_rounds", "async_rounds", "seed", "sync_defaults"),
        ),
        "files": str(root),
        "runs": runs,
        "targets": targets,
    }


def _dirname(name: str) -> str:
    return name.replace(" ", "").replace(",", "-").replace("=", "")


def render_lagged(result: dict[str, Any]) -> list[str]:
    rows = []
    for name, r in result["runs"].items():
        ext, st, late = r["external_after_lag"], r["staleness"], r["external_after_all_playing_plus_lag"]
        rows.append(
            [
                name, r["wall_s"], r["sync_lag"], r["worker_rounds"], r["seconds_per_worker_round"],
                r["coordinator_round_seconds_mean"], f"{ext['received']}/{ext['asked']}", ext["fraction"],
                f"{late['received']}/{late['asked']}", late["fraction"],
                st["age_s_median"], st["age_s_p90"], st["rounds_median"],
            ]
        )  # fmt: skip
    header = [
        "run", "wall s", "SYNC_LAG", "worker rounds", "s per worker round (start to start)",
        "coordinator's round s (sync)", "external got/asked after the lag", "fraction",
        "got/asked, lag after all play", "fraction",
        "median age of externals (s)", "p90 age (s)", "median staleness (own rounds)",
    ]  # fmt: skip
    return [markdown_table(header, rows)]


# -- figure 3: Drive emulator requests per worker round ---------------------------------------------------------

FOLDER_MIME = "application/vnd.google-apps.folder"


def request_kind(method: str, raw_path: str) -> str:
    """What one Drive API request (the emulator's log: method and path with query) did: ``file create``, ``file
    update``, ``folder create``, ``folder lookup <level>`` (a query for a folder by name: ``round``, ``stage`` or
    ``other``), ``listing``, ``download``, ``delete`` or ``other``."""
    split = urlsplit(raw_path)
    if split.path.startswith("/upload/"):
        return "file create" if method == "POST" else "file update"
    if method == "DELETE":
        return "delete"
    if method == "POST" and split.path.rstrip("/").endswith("/files"):
        return "folder create"
    if method == "GET" and split.path.rstrip("/").endswith("/files"):
        q = parse_qs(split.query).get("q", [""])[0]
        if FOLDER_MIME in q and "name = " in q:
            name = q.split("name = ", 1)[1].strip("'\" ").split("'", 1)[0]
            level = "round" if name.startswith("round_") else "stage" if name.startswith("stage_") else "other"
            return f"folder lookup {level}"
        return "listing"
    if method == "GET" and "alt=media" in split.query:
        return "download"
    return "other"


def request_kinds(requests: Iterable[tuple[str, str]]) -> dict[str, int]:
    """Requests by :func:`request_kind`, most frequent first."""
    return dict(Counter(request_kind(m, p) for m, p in requests).most_common())


def drive_run(mode: str, args: argparse.Namespace, emulator: Any, folder: Path) -> dict[str, Any]:
    """``bench.coordination``'s swarm on the Drive emulator with the coordinator's ROUND_MODE = ``mode``."""
    from bench import coordination as co
    from swarm_gdrive.config import from_env
    from swarm_gdrive.protocol.layout import Layout

    spec = co.RunSpec(
        "drive", args.drive_workers, args.drive_transplants, rounds=args.drive_rounds, latency_s=args.latency,
        completion_chars=args.completion_chars, step_seconds=args.drive_step,
    )  # fmt: skip
    layout = Layout("bench")
    gdrive_path, make_storage = co._backend_factory(spec, folder, emulator)
    env = co.swarm_env(spec, gdrive_path, folder / "local", "bench")
    roles = [("coordinator", "coord")] + [("worker", f"w{i}") for i in range(1, spec.workers + 1)]
    nodes = [
        co.NodeThread(
            from_env({**env, "NODE_ROLE": role, "NODE_ID": node, "ROUND_MODE": mode}),
            co.CountingStorage(make_storage(), layout),
            spec.completion_chars,
        )
        for role, node in roles
    ]
    before = co.request_count(emulator)
    logged = len(emulator.requests)
    started = time.monotonic()
    for n in nodes:
        n.start()
    for n in nodes:
        n.join(max(0.0, started + args.timeout - time.monotonic()))
    timed_out = any(n.is_alive() for n in nodes)
    for n in nodes:
        n.stop.set()
    for n in nodes:
        n.join(30)
    analysed = co.analyse(spec, layout, nodes[0], nodes[1:])
    requests = co.request_count(emulator) - before
    kinds = request_kinds(emulator.requests[logged:])  # every node's, the coordinator's too
    store = make_storage()  # the workers' metric lines, read back from the emulator after the count
    fills = [external_fill(parse_jsonl(store.read_bytes(layout.metrics_file(w)))) for _, w in roles[1:]]
    return {
        "mode": mode,
        "spec": analysed["spec"],
        "wall_s": time.monotonic() - started,
        "timed_out": timed_out,
        "errors": {n.config.node_id: n.error for n in nodes if n.error},
        "all_reached_last_round": analysed["all_reached_last_round"],
        "windows_per_worker": analysed["worker_per_round"]["windows_per_worker"],
        "worker_requests_per_round": analysed["worker_per_round"]["api_calls"],
        "worker_api_by_call": analysed["worker_per_round"]["api_by_call"],
        "emulator_requests": requests,
        "emulator_requests_by_kind": kinds,
        "emulator_requests_by_kind_per_worker_round": {
            k: round(v / (spec.workers * spec.rounds), 2) for k, v in kinds.items()
        },
        "external": pooled_fill(fills),
    }


def drive(args: argparse.Namespace) -> dict[str, Any]:
    if str(TESTS_DIR) not in sys.path:
        sys.path.insert(0, str(TESTS_DIR))
    from drive_emulator import DriveEmulator

    emulator = DriveEmulator().start()
    emulator.call_latency_s = args.latency
    runs = {}
    try:
        for mode in MODES:
            with tempfile.TemporaryDirectory(prefix=f"bench-rounds-drive-{mode}-") as tmp:
                runs[mode] = drive_run(mode, args, emulator, Path(tmp))
            _say(f"drive {mode}: {runs[mode]['wall_s']:.0f} s, {runs[mode]['worker_requests_per_round']} requests")
    finally:
        emulator.stop()
    targets = [_target("Drive requests per worker round", runs, lambda r: r["worker_requests_per_round"], "<=", 20)]
    return {
        "settings": _settings(
            args, ("drive_workers", "drive_transplants", "drive_rounds", "drive_step", "latency", "completion_chars")
        ),
        "runs": runs,
        "targets": targets,
    }


def render_drive(result: dict[str, Any]) -> list[str]:
    rows = [
        [
            m, r["wall_s"], r["all_reached_last_round"], r["windows_per_worker"], r["worker_requests_per_round"],
            f"{r['external']['received']}/{r['external']['asked']}" if "external" in r else None,
        ]
        for m, r in result["runs"].items()
    ]  # fmt: skip
    header = [
        "mode", "wall s", "all rounds played", "rounds measured a worker", "Drive requests per worker round",
        "external got/asked (all rounds)",
    ]  # fmt: skip
    out = [markdown_table(header, rows)]
    by_kind = {m: r.get("emulator_requests_by_kind_per_worker_round") for m, r in result["runs"].items()}
    if all(by_kind.values()):
        modes = list(by_kind)
        kinds = sorted(
            {k for v in by_kind.values() for k in v}, key=lambda k: -max(v.get(k, 0) for v in by_kind.values())
        )
        out.append(
            "Every node's requests (the coordinator's too) by kind, per worker round (total / (workers x rounds)):"
        )
        out.append(markdown_table(["kind", *modes], [[k, *(by_kind[m].get(k, 0) for m in modes)] for k in kinds]))
    return out


# -- common -----------------------------------------------------------------------------------------------------


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _settings(args: argparse.Namespace, keys: Iterable[str]) -> dict[str, Any]:
    return {k: getattr(args, k) for k in keys}


def _target(name: str, runs: dict[str, Any], get: Any, op: str, bound: float) -> dict[str, Any]:
    """A target row: every run's value, and whether the async one meets ``op bound``."""
    values = {mode: finite(get(r)) for mode, r in runs.items()}
    value = values.get("async")
    met = None if value is None else (value >= bound if op == ">=" else value <= bound)
    return {"figure": name, "values": values, "target": f"{op} {bound:g}", "met": met}


def render_targets(targets: list[dict[str, Any]]) -> str:
    modes = sorted({m for t in targets for m in t["values"]}, key=lambda m: (m != "sync", m))
    verdict = {True: "**met**", False: "**missed**"}
    rows = [
        [t["figure"], *(t["values"].get(m) for m in modes), t["target"], verdict.get(t["met"], "—")] for t in targets
    ]
    return markdown_table(["figure", *modes, "target (async)", ""], rows)


RENDER = {"hetero": render_hetero, "lagged": render_lagged, "drive": render_drive}
RUN = {"hetero": hetero, "lagged": lagged, "drive": drive}


def render(result: dict[str, Any]) -> str:
    figure = result["figure"]
    return "\n\n".join(
        [
            f"# Issue #28, {figure}: synchronous against asynchronous rounds",
            machine_line(result["machine"]),
            f"Settings: {json.dumps(result['settings'])}. Wall time of the invocation: {result['wall_s']:.0f} s.",
            *RENDER[figure](result),
            render_targets(result["targets"]),
        ]
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench rounds", description=__doc__.splitlines()[0])
    p.add_argument("--figure", choices=sorted(RUN), required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=1200, help="per run, seconds")
    p.add_argument("--fast-step", type=float, default=1.0, help="hetero: the fast worker's SYNTHETIC_STEP_SECONDS")
    p.add_argument("--slow-step", type=float, default=15.0, help="hetero: the slow worker's SYNTHETIC_STEP_SECONDS")
    p.add_argument("--slow-rounds", type=int, default=6, help="hetero: the slow worker's rounds played")
    p.add_argument("--workers", type=int, default=3, help="lagged: workers")
    p.add_argument("--min-lag", type=float, default=5.0)
    p.add_argument("--max-lag", type=float, default=90.0)
    p.add_argument("--transplants", type=int, default=2, help="lagged: J")
    p.add_argument("--sync-rounds", type=int, default=3, help="lagged: MAX_ROUNDS of the sync run")
    p.add_argument("--async-rounds", type=int, default=200, help="lagged: MAX_ROUNDS of the async run (ends at most "
                   "with the sync one)")  # fmt: skip
    p.add_argument("--sync-defaults", action="store_true", help="lagged: also a sync run with SYNC_LAG=0")
    p.add_argument("--drive-workers", type=int, default=16)
    p.add_argument("--drive-transplants", type=int, default=4)
    p.add_argument("--drive-rounds", type=int, default=4)
    p.add_argument("--drive-step", type=float, default=0.5)
    p.add_argument("--latency", type=float, default=0.15, help="drive: seconds per Drive request")
    p.add_argument("--completion-chars", type=int, default=1000, help="drive: completions padded to this length")
    p.add_argument("--tag", default=None, help="result file tag (default: <figure>-<machine>)")
    p.add_argument("--out-dir", type=Path, default=None, help="default bench/results")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    source = source_version()
    logging.basicConfig(level=logging.ERROR)
    started = time.monotonic()
    result = {"part": "rounds", "figure": args.figure, **RUN[args.figure](args)}
    result["wall_s"] = time.monotonic() - started
    result["machine"] = machine_info("cpu", source)
    tag = args.tag or f"{args.figure}-{machine_tag('cpu')}"
    path = write_result("rounds", tag, result, render(result), args.out_dir)
    _say(f"wrote {path} and {path.with_suffix('.md')}")
    return 0
