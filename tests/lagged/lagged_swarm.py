"""A coordinator and workers as real processes, each on its own replica of a :class:`LaggedMount`, and the
figures of the run: rounds completed, external groups asked vs received per worker and round, rounds closed on
the deadline, round durations, skipped rounds, and which rewards the coordinator's replica held when it exited.

Used by ``test_lagged_swarm.py`` (CI) and ``run_lagged_swarm.py`` (the long runs, as a script).
"""

from __future__ import annotations

import json
import random
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
    rewards: dict[str, dict[int, RewardRecord]]  # worker -> round -> its reward, from its own replica
    coordinator_has: dict[str, set[int]]  # worker -> rounds whose reward the coordinator's replica held at its exit
    mount: dict

    def events(self, name: str, node: str = COORDINATOR) -> list[EventRecord]:
        source = self.coordinator_events if node == COORDINATOR else self.worker_events.get(node, [])
        return [e for e in source if e.event == name]

    def closes(self) -> list[EventRecord]:
        """The coordinator's round-closing events, one per round played."""
        return [e for e in self.coordinator_events if e.event in ("round_advanced", "experiment_finished")]

    def round_seconds(self) -> dict[int, float]:
        opened = {e.data["to_round"]: e.ts for e in self.coordinator_events if e.event == "round_opened"}
        out = {}
        for close in self.closes():
            start = opened.get(close.round)
            if start is not None:
                out[close.round] = close.ts - start
            opened[close.data["to_round"]] = close.ts
        return out

    def counted(self) -> dict[int, int]:
        """Per round: rewards the coordinator counted, at the close plus late ones (``late_submission``)."""
        out = {e.round: int(e.data["submitted"]) for e in self.closes()}
        for late in self.events("late_submission"):
            out[late.round] = out.get(late.round, 0) + 1
        return out

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
        return {
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
            "mount": self.mount,
        }


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
        rewards={w: _rewards(mount.replica(w), w, spec.rounds) for w in spec.workers},
        coordinator_has=coordinator_has,
        mount=mount.summary(),
    )
    mount.save(folder / "mount.json")
    (folder / "figures.json").write_text(json.dumps(outcome.figures(), indent=1, default=str))
    return outcome
