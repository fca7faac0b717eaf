"""A coordinator and workers as real processes, each on its own replica of a :class:`LaggedMount`, and the
figures of the run: rounds completed, external groups asked vs received per worker and round, rounds closed on
the deadline, round durations, skipped rounds, and which rewards the coordinator's replica held when it exited.
An asynchronous run (``ROUND_MODE=async`` on the coordinator, GDRIVE_IMPLEMENTATION.md §5.10) has no rounds of the
coordinator: its figures are each worker's own rounds and their seconds, the workers the coordinator saw done, and
the age and staleness of the external groups taken.

Used by ``test_lagged_swarm.py`` (CI) and ``run_lagged_swarm.py`` (the long runs, as a script).
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from lagged_mount import Lag, LaggedMount

from swarm_gdrive.procs import NodeProcess, stop_all
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import EventRecord, MetricRecord, RewardRecord, StateRecord, decode, decode_lines

EXPERIMENT = "lagged"
LAYOUT = Layout(EXPERIMENT)
COORDINATOR = "coordinator"


@dataclass
class SwarmSpec:
    """One lagged run. ``lags``: node -> how late it sees the others (the coordinator and ``w1..wN``)."""

    lags: dict[str, Lag]
    seed: int
    rounds: int = 4
    transplants: int = 2
    step_seconds: float = 1.0
    #: SYNC_LAG given to every node; None: the largest ``Lag.high`` (the bound the double keeps).
    sync_lag: float | None = None
    #: More variables for every node (explicit timeouts, for a run without SYNC_LAG).
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 3600.0
    #: ROUND_MODE, given to the coordinator only (the workers follow the experiment's mode).
    round_mode: str = "sync"

    @property
    def workers(self) -> list[str]:
        return sorted(n for n in self.lags if n != COORDINATOR)

    @property
    def declared_lag(self) -> float:
        return max(lag.high for lag in self.lags.values()) if self.sync_lag is None else self.sync_lag


def spread_lags(workers: int, low: float, high: float, seed: int) -> dict[str, Lag]:
    """Every node its own lag: the coordinator and one worker see the others up to ``high`` late, the other
    workers up to a ``high`` drawn in [low + (high - low) / 4, high] (seeded)."""
    rng = random.Random(seed)
    names = [COORDINATOR] + [f"w{i}" for i in range(1, workers + 1)]
    lags = {}
    for i, name in enumerate(names):
        top = high if i < 2 else rng.uniform(low + (high - low) / 4, high)
        lags[name] = Lag(low, round(top, 1))
    return lags


def node_env(spec: SwarmSpec, mount: LaggedMount, node: str, local: Path) -> dict[str, str]:
    env = {
        "GDRIVE_PATH": str(mount.replica(node)),
        "EXPERIMENT_NAME": EXPERIMENT,
        "NODE_ID": node,
        "NODE_ROLE": "coordinator" if node == COORDINATOR else "worker",
        "SWARM_LOCAL_DIR": str(local / node),
        "WORKLOAD": "synthetic",
        "SEED": str(spec.seed),
        "MAX_ROUNDS": str(spec.rounds),
        "MIN_WORKERS": str(len(spec.workers)),
        "NUM_TRANSPLANT_TREES": str(spec.transplants),
        "NUM_TRAIN_SAMPLES": "4",
        "NUM_GENERATIONS": "4",
        "SYNTHETIC_STEP_SECONDS": str(spec.step_seconds),
        "SYNC_LAG": f"{spec.declared_lag:g}",
        "HEARTBEAT_INTERVAL": "2",
        "POLL_INTERVAL_MIN": "0.2",
        "POLL_INTERVAL_MAX": "2",
    }
    if node == COORDINATOR:  # always: ROUND_MODE=auto, the default, is async wherever SYNC_LAG > 0
        env["ROUND_MODE"] = spec.round_mode
    return {**env, **spec.env}


@dataclass
class Outcome:
    """What a lagged run did; ``figures()`` is what GDRIVE_IMPLEMENTATION.md reports."""

    spec: SwarmSpec
    codes: dict[str, int | None]
    seconds: float
    state: StateRecord | None
    coordinator_events: list[EventRecord]
    coordinator_metrics: list[MetricRecord]
    worker_events: dict[str, list[EventRecord]]
    worker_metrics: dict[str, list[MetricRecord]]
    rewards: dict[str, dict[int, RewardRecord]]  # worker -> round -> its reward, from its own replica
    coordinator_has: dict[str, set[int]]  # worker -> rounds whose reward the coordinator's replica held at its exit
    mount: dict

    @property
    def mode(self) -> str:
        """The run's ROUND_MODE, as its coordinator recorded it (state, else its ``round_opened`` event)."""
        if self.state is not None:
            return self.state.mode
        opened = self.events("round_opened")
        return str(opened[0].data.get("mode", "sync")) if opened else "sync"

    def events(self, name: str, node: str = COORDINATOR) -> list[EventRecord]:
        source = self.coordinator_events if node == COORDINATOR else self.worker_events.get(node, [])
        return [e for e in source if e.event == name]

    def closes(self) -> list[EventRecord]:
        """The coordinator's round-closing events, one per round played (none in an asynchronous run, whose
        ``experiment_finished`` closes no round)."""
        if self.mode == "async":
            return []
        return [e for e in self.coordinator_events if e.event in ("round_advanced", "experiment_finished")]

    def round_seconds(self) -> dict[int, float]:
        """Per round of the coordinator's clock, its length; empty in an asynchronous run (see
        :meth:`worker_round_seconds`)."""
        if self.mode == "async":
            return {}
        opened = {e.data["to_round"]: e.ts for e in self.coordinator_events if e.event == "round_opened"}
        out = {}
        for close in self.closes():
            start = opened.get(close.round)
            if start is not None:
                out[close.round] = close.ts - start
            opened[close.data["to_round"]] = close.ts
        return out

    def counted(self) -> dict[int, int]:
        """Per round: rewards the coordinator counted, at the close plus late ones (``late_submission``); empty in
        an asynchronous run, where the coordinator counts workers done (:meth:`done`)."""
        out = {e.round: int(e.data["submitted"]) for e in self.closes()}
        for late in self.events("late_submission"):
            out[late.round] = out.get(late.round, 0) + 1
        return out

    def done(self) -> list[str]:
        """The workers the coordinator saw play their last round (``worker_completed``, asynchronous runs)."""
        return sorted(str(e.data["node"]) for e in self.events("worker_completed"))

    def worker_round_seconds(self) -> dict[str, dict[int, float]]:
        """worker -> round R >= 1 -> seconds between its rewards of R - 1 and R (its own clock: one machine here)."""
        out: dict[str, dict[int, float]] = {}
        for w, by_round in self.rewards.items():
            out[w] = {
                r: rec.submitted_at - by_round[r - 1].submitted_at for r, rec in by_round.items() if r - 1 in by_round
            }
        return out

    def taken(self) -> dict[str, list[dict]]:
        """worker -> every external group it trained on, from its ``externals_taken`` events (asynchronous runs):
        source, source_round, group_id, age_s, staleness_rounds and the receiver's round."""
        out: dict[str, list[dict]] = {}
        for w in self.spec.workers:
            out[w] = [
                {"round": e.round, "source": s, "source_round": sr, "group_id": g, "age_s": a, "staleness_rounds": st}
                for e in self.events("externals_taken", w)
                for s, sr, g, a, st in zip(
                    e.data["sources"],
                    e.data["source_rounds"],
                    e.data["group_ids"],
                    e.data["age_s"],
                    e.data["staleness_rounds"],
                    strict=True,
                )
            ]
        return out

    def stages_played(self) -> dict[str, list[int]]:
        """worker -> the round of each stage it played (its stage metric lines), in the order written."""
        return {
            w: [m.round for m in self.worker_metrics.get(w, []) if "swarm/external_used" in m.values]
            for w in self.spec.workers
        }

    def skipped(self) -> dict[str, list[int]]:
        return {
            w: [
                r
                for e in self.events("round_skipped", w)
                for r in range(e.data["skipped_from"], e.data["skipped_to"] + 1)
            ]
            for w in self.spec.workers
        }

    def external(self) -> dict[int, dict[str, tuple[int, int]]]:
        """round -> worker -> (J asked, external groups received), from the workers' reward records."""
        out: dict[int, dict[str, tuple[int, int]]] = {}
        for w, by_round in self.rewards.items():
            for r, rec in by_round.items():
                out.setdefault(r, {})[w] = (rec.external_requested, rec.num_external_groups)
        return out

    def figures(self) -> dict:
        external = self.external()
        asked = sum(a for row in external.values() for a, _ in row.values())
        got = sum(g for row in external.values() for _, g in row.values())
        full = sum(1 for row in external.values() for a, g in row.values() if g >= a)
        durations = self.round_seconds()
        per_worker = self.worker_round_seconds()
        taken = [g for groups in self.taken().values() for g in groups]
        return {
            "mode": self.mode,
            "seed": self.spec.seed,
            "lags": {n: [lag.low, lag.high] for n, lag in self.spec.lags.items()},
            "sync_lag": self.spec.declared_lag,
            "explicit": self.spec.env,
            "exit_codes": self.codes,
            "wall_seconds": round(self.seconds, 1),
            "state": None if self.state is None else f"{self.state.status} at round {self.state.round}",
            "rounds_completed": len(self.closes()),
            "closed_on_deadline": sum(1 for e in self.closes() if e.data["reason"] == "interval"),
            "round_seconds": {r: round(s, 1) for r, s in sorted(durations.items())},
            "round_seconds_mean": round(sum(durations.values()) / len(durations), 1) if durations else None,
            "counted_per_round": dict(sorted(self.counted().items())),
            "late_submissions": len(self.events("late_submission")),
            "skipped": self.skipped(),
            "rewards_written": {w: sorted(r) for w, r in self.rewards.items()},
            "coordinator_replica_rewards": {w: sorted(r) for w, r in self.coordinator_has.items()},
            "external_per_round": {
                r: {w: f"{g}/{a}" for w, (a, g) in sorted(row.items())} for r, row in sorted(external.items())
            },
            "external_received": f"{got}/{asked}",
            "worker_rounds_with_all_external": f"{full}/{sum(len(row) for row in external.values())}",
            "rollout_wait_expired": {w: len(self.events("rollout_wait_expired", w)) for w in self.spec.workers},
            "workers_done": self.done(),
            "worker_round_seconds_mean": {
                w: round(sum(s.values()) / len(s), 2) if s else None for w, s in sorted(per_worker.items())
            },
            "worker_round_seconds_max": {
                w: round(max(s.values()), 2) if s else None for w, s in sorted(per_worker.items())
            },
            "externals_taken": len(taken),
            "external_age_s_median": _median([g["age_s"] for g in taken]),
            "external_staleness_rounds_median": _median([g["staleness_rounds"] for g in taken]),
            "external_staleness_rounds_max": max((g["staleness_rounds"] for g in taken), default=None),
            "mount": self.mount,
        }


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def _read_log(folder: Path, path: str, model) -> list:
    file = folder / path
    return decode_lines(file.read_bytes(), model)[0] if file.exists() else []


def _rewards(folder: Path, node: str, rounds: int) -> dict[int, RewardRecord]:
    out = {}
    for r in range(rounds):
        file = folder / LAYOUT.reward_file(r, 0, node)
        if file.exists():
            out[r] = decode(file.read_bytes(), RewardRecord)
    return out


def run(spec: SwarmSpec, folder: Path, progress: bool = False) -> Outcome:
    """Run the swarm to its end on a lagged mount under ``folder``; every node's output goes to nodes.log."""
    folder.mkdir(parents=True, exist_ok=True)
    mount = LaggedMount(folder / "replicas", spec.lags, spec.seed, max_seconds=spec.timeout + 60)
    log, lock = (folder / "nodes.log").open("w"), threading.Lock()

    def sink(line: str) -> None:
        with lock:
            log.write(line + "\n")
            log.flush()
        if progress and ("round" in line and ("event" in line or "stage" in line)):
            print(line, flush=True)

    nodes: dict[str, NodeProcess] = {}
    coordinator_has: dict[str, set[int]] = {}
    started = time.monotonic()
    mount.start()
    try:
        for node in [COORDINATOR, *spec.workers]:
            nodes[node] = NodeProcess(node, node_env(spec, mount, node, folder / "local"), sink)
        running = set(nodes)
        while running and time.monotonic() - started < spec.timeout:
            for node in sorted(running):
                if nodes[node].returncode is not None:
                    mount.freeze(node)  # its runtime ended: nothing reaches its replica any more
                    running.discard(node)
                    if node == COORDINATOR:
                        coordinator_has = {
                            w: set(_rewards(mount.replica(COORDINATOR), w, spec.rounds)) for w in spec.workers
                        }
            time.sleep(0.1)
    finally:
        stop_all([p for p in nodes.values() if p.returncode is None], timeout=10)
        mount.stop()
        log.close()
    seconds = time.monotonic() - started
    home = mount.replica(COORDINATOR)
    state_file = home / LAYOUT.state_file
    outcome = Outcome(
        spec=spec,
        codes={n: p.returncode for n, p in nodes.items()},
        seconds=seconds,
        state=decode(state_file.read_bytes(), StateRecord) if state_file.exists() else None,
        coordinator_events=_read_log(home, LAYOUT.events_file(COORDINATOR), EventRecord),
        coordinator_metrics=_read_log(home, LAYOUT.metrics_file(COORDINATOR), MetricRecord),
        worker_events={w: _read_log(mount.replica(w), LAYOUT.events_file(w), EventRecord) for w in spec.workers},
        worker_metrics={w: _read_log(mount.replica(w), LAYOUT.metrics_file(w), MetricRecord) for w in spec.workers},
        rewards={w: _rewards(mount.replica(w), w, spec.rounds) for w in spec.workers},
        coordinator_has=coordinator_has,
        mount=mount.summary(),
    )
    mount.save(folder / "mount.json")
    (folder / "figures.json").write_text(json.dumps(outcome.figures(), indent=1, default=str))
    return outcome
