"""The read-only monitor: an experiment folder into tables (:func:`load`), health findings
(:func:`findings`) and the TEST_MODE validator (:func:`validate`); the ``status`` / ``validate`` commands that print
them are :mod:`swarm_gdrive.cli.readers`.

The monitor never writes to the shared folder: it lists and reads through
:class:`~swarm_gdrive.protocol.exchange.Exchange` (capped, validated, cross-checked) and the log files
through :mod:`swarm_gdrive.observe.logs`. Whatever it cannot read (a hostile or broken file, a folder
where a file belongs) is a problem of the snapshot, reported by the ``unreadable`` finding, never a crash.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Literal

import pandas as pd

from swarm_gdrive.names import InvalidNameError, validate_name
from swarm_gdrive.observe import usage as folder_usage
from swarm_gdrive.observe.logs import (
    EVENT_COLUMNS,
    EXTERNAL_COLUMNS,
    LOG_FILES,
    MAX_LOG_BYTES,
    METRIC_COLUMNS,
    load_logs,
    printable,
)
from swarm_gdrive.protocol.exchange import NOT_A_FOLDER, Exchange, RunChangedError
from swarm_gdrive.protocol.layout import Layout, parse_round_dir, parse_stage_dir
from swarm_gdrive.storage import FileInfo, Storage
from swarm_gdrive.storage.base import StorageUnavailableError, escaped_name

logger = logging.getLogger(__name__)
#: Folders under experiments/ already reported as no experiment's (each is logged once per process).
_not_experiments: set[str] = set()

__all__ = [
    "EVENT_COLUMNS",
    "EXTERNAL_COLUMNS",
    "LOG_FILES",
    "MAX_LOG_BYTES",
    "METRIC_COLUMNS",
]  # re-exported: their home is logs

#: Seconds without a heartbeat after which the monitor calls a node not alive (LIVENESS_TIMEOUT's default).
LIVENESS = 120.0
#: The monitor's node id in its Exchange; it never publishes anything under it.
MONITOR_ID = "monitor"
#: Problems quoted by the ``unreadable`` finding (it counts them all).
PROBLEMS_SHOWN = 5
#: The folders of an experiment (GDRIVE_IMPLEMENTATION.md §2).
TOP_FOLDERS = ("state", "peers", "rewards", "rollouts", "evals", "logs", "checkpoints")
#: Rounds listed in a finding (the rest are counted).
ROUNDS_SHOWN = 20
#: Rounds x stages the missing-reward finding walks at most per worker.
MAX_CELLS_CHECKED = 1_000_000
#: Node files the monitor examines at most in one folder (the peers folder, a round's stage of rewards or rollouts,
#: an eval round, logs/): twice the largest swarm measured (bench part 1: 128 workers). A participant of the folder
#: can plant any number of files; beyond this the rest are counted, not read (the ``unreadable`` finding says so),
#: so that a reader's time is bounded by the rounds and stages it shows, not by what was planted.
MAX_FILES_PER_FOLDER = 256

STATE_COLUMNS = [
    "experiment",
    "run_id",
    "round",
    "status",
    "seq",
    "max_rounds",
    "num_stages",
    "round_opened_at",
    "round_deadline",
    "live_workers",
    "advance_reason",
    "coordinator_id",
    "updated_at",
    "mode",
]
PEER_COLUMNS = ["node", "role", "status", "heartbeat", "heartbeat_at", "round", "registered_at", "alive"]
REWARD_COLUMNS = ["node", "round", "stage", "reward", "local_groups", "external_groups", "external_requested"]
ROLLOUT_COLUMNS = ["round", "stage", "node", "groups", "bytes"]
#: A ``sapo_starved`` warning when workers received fewer external groups than asked in at least this share of
#: their rounds (below it, an info finding): SAPO then trains on fewer peer groups than configured.
SAPO_SHORTFALL_WARNING = 0.25
#: Rounds shown in the status table's external-groups table.
EXTERNAL_ROUNDS_SHOWN = 10
#: Rollouts above this total are flagged: Drive's free 15 GB fills up; ROLLOUT_CLEANUP_ENABLED keeps it flat.
STORAGE_WARNING_BYTES = 1 << 30
EVAL_COLUMNS = [
    "node",
    "round",
    "task",
    "level",
    "n",
    "pass1",
    "pass1_se",
    "mean_score",
    "mean_score_se",
    "k",
    "pass_k",
    "pass_k_se",
]


@dataclass
class Snapshot:
    """One observation of an experiment folder, at ``now`` on the monitor's clock."""

    experiment: str
    now: float
    state: pd.DataFrame
    peers: pd.DataFrame
    rewards: pd.DataFrame
    rollouts_per_round: pd.DataFrame
    evals: pd.DataFrame
    events: pd.DataFrame
    metrics: pd.DataFrame
    #: The experiment.json config (fingerprint fields), empty when absent.
    config: dict = field(default_factory=dict)
    #: node -> the log file names present under logs/{node}/.
    log_files: dict[str, set[str]] = field(default_factory=dict)
    #: What could not be read: rejected files (``path: reason``), log lines (``path: line N: reason``), metric
    #: keys beyond the caps.
    problems: list[str] = field(default_factory=list)
    #: The folder's size, its last hour's writes and the storage's room (observe/usage.py); None: not measured.
    usage: folder_usage.FolderUsage | None = None
    #: The external groups asynchronous workers took (their ``externals_taken`` events): EXTERNAL_COLUMNS.
    externals: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=EXTERNAL_COLUMNS))

    @property
    def state_record(self) -> dict | None:
        return None if self.state.empty else self.state.iloc[0].to_dict()

    @property
    def is_async(self) -> bool:
        """The experiment plays asynchronous rounds (the state's ``mode``, GDRIVE_IMPLEMENTATION.md §5.10): the
        state's round is no clock, each worker's progress is its own."""
        state = self.state_record
        return state is not None and state.get("mode") == "async"

    def workers(self) -> list[str]:
        if self.peers.empty:
            return []
        return sorted(self.peers.loc[self.peers["role"] == "worker", "node"])


@dataclass(frozen=True)
class Finding:
    severity: Literal["info", "warning", "error"]
    code: str
    message: str


@dataclass
class Bounds:
    """What the monitor examines of folders a participant may have flooded (GDRIVE_IMPLEMENTATION.md's threat
    model: anyone who can write the folder can plant files in it).

    Round folders past the state's ``max_rounds`` (evals: the model after R rounds, so up to ``max_rounds``) and
    stage folders past its ``num_stages`` hold nothing a node of this run writes: they are counted, not read. In a
    folder with more than ``per_folder`` node files (logs/: node folders), those of ``first`` (the state's live
    workers and coordinator, the registered peers) are all examined, the others in name order only up to
    ``per_folder`` in all; the rest are counted. Every such count is a problem of the snapshot (the ``unreadable``
    finding). On the folder of a normal experiment nothing is left out.
    """

    max_rounds: int | None = None
    num_stages: int | None = None
    first: set[str] = field(default_factory=set)
    per_folder: int = field(default_factory=lambda: MAX_FILES_PER_FOLDER)
    problems: list[str] = field(default_factory=list)

    def rounds(self, exchange: Exchange, folder: str, slack: int = 0) -> list[tuple[str, int]]:
        """``(folder name, round)`` of ``folder``'s round folders up to ``max_rounds`` - 1 + ``slack``."""
        return self._numbered(exchange, folder, parse_round_dir, self.max_rounds, slack, "round", "max_rounds")

    def stages(self, exchange: Exchange, folder: str) -> list[tuple[str, int]]:
        """``(folder name, stage)`` of ``folder``'s stage folders below ``num_stages``."""
        return self._numbered(exchange, folder, parse_stage_dir, self.num_stages, 0, "stage", "num_stages")

    def _numbered(self, exchange, folder, parse, limit, slack, what, setting) -> list[tuple[str, int]]:
        found = [(info.name, number) for info, number in exchange.numbered_folders(folder, parse)]
        if limit is None:
            return found
        kept = [(name, number) for name, number in found if number < limit + slack]
        if len(kept) < len(found):
            past = sorted(number for _, number in found if number >= limit + slack)
            self.problems.append(
                f"{folder}: {len(past)} {what} folder(s) past the state's {setting} ({limit}) not examined "
                f"({what}s {_ranges(past)}): no node of this run writes there"
            )
        return kept

    def pick(self, folder: str, entries: dict[str, FileInfo]) -> dict[str, FileInfo]:
        """Every entry of a node of ``first`` (the run's known nodes: as many as the state and the peers folder name,
        so a swarm of any size is read whole), and of the others at most what ``per_folder`` leaves; the rest
        counted."""
        if len(entries) <= self.per_folder:
            return entries
        known = [node for node in entries if node in self.first]
        others = sorted(node for node in entries if node not in self.first)
        room = max(0, self.per_folder - len(known))
        if len(others) > room:
            self.problems.append(
                f"{folder}: {len(others) - room} more file(s) not examined: the monitor reads the run's known nodes' "
                f"files (or log folders) and at most {self.per_folder} in all of a folder (MAX_FILES_PER_FOLDER); "
                "those were written by something other than this run's nodes"
            )
        return {node: entries[node] for node in sorted(known) + others[:room]}


def load(storage: Storage, experiment: str, now: float | None = None, liveness_timeout: float = LIVENESS) -> Snapshot:
    """Read the experiment folder into DataFrames.

    ``peers.alive`` is True when the peer's status is ``alive`` and its ``heartbeat_at`` is within
    ``liveness_timeout`` seconds of ``now``. The nodes judge liveness by watching a heartbeat change
    on their own clock; the monitor has a single observation, so it compares the writer's
    ``heartbeat_at`` with its own clock (``now``, default ``time.time()``) and is only as right as
    the two clocks agree (and, on a mounted Drive, as fresh as the sync).
    """
    now = time.time() if now is None else now
    layout = Layout(experiment)
    problems: list[str] = []
    exchange = Exchange(
        storage, layout, MONITOR_ID, on_reject=lambda path, reason: problems.append(f"{path}: {reason}")
    )
    problems += _layout_problems(exchange)
    experiment_record = exchange.read_experiment()
    if experiment_record is not None:
        exchange.run_id = experiment_record.run_id  # from here on, files of another run are rejected
    try:
        state = exchange.read_state()
    except RunChangedError as exc:  # a reset on its way, or a forged state
        problems.append(f"{layout.state_file}: {exc}, not experiment.json's")
        state = None
    if state is not None and exchange.run_id is None:
        exchange.run_id = state.run_id
    state_df = pd.DataFrame([state.model_dump(include=set(STATE_COLUMNS))] if state else [], columns=STATE_COLUMNS)
    bounds = Bounds(problems=problems)
    if state is not None:
        bounds.max_rounds, bounds.num_stages = state.max_rounds, state.num_stages
        bounds.first = {*state.live_workers, state.coordinator_id}
    peer_entries = bounds.pick(layout.peers_dir, exchange.peer_files())
    observed_peers = exchange.read_peer_files(peer_entries)
    bounds.first |= {node for node, observed in observed_peers.items() if observed.record is not None}
    peers = pd.DataFrame(
        [
            {
                "node": node,
                "role": rec.role,
                "status": rec.status,
                "heartbeat": rec.heartbeat,
                "heartbeat_at": rec.heartbeat_at,
                "round": rec.round,
                "registered_at": rec.registered_at,
                "alive": rec.status == "alive" and now - rec.heartbeat_at <= liveness_timeout,
            }
            for node, observed in sorted(observed_peers.items())
            if (rec := observed.record) is not None
        ],
        columns=PEER_COLUMNS,
    )
    rewards = _sorted(pd.DataFrame(reward_rows(exchange, bounds), columns=REWARD_COLUMNS), ["node", "round", "stage"])
    rollouts = _sorted(pd.DataFrame(_rollout_rows(exchange, bounds), columns=ROLLOUT_COLUMNS), ROLLOUT_COLUMNS)
    evals = pd.DataFrame(eval_rows(exchange, bounds), columns=EVAL_COLUMNS)
    logs = load_logs(exchange, problems, bounds.pick)  # at most per_folder nodes' log folders
    return Snapshot(
        experiment=experiment,
        now=now,
        state=state_df,
        peers=peers,
        rewards=rewards,
        rollouts_per_round=rollouts,
        evals=evals,
        events=logs.events,
        metrics=logs.metrics,
        config=dict(experiment_record.config) if experiment_record else {},
        log_files={node: present & set(LOG_FILES) for node, present in logs.present.items()},
        problems=problems,
        usage=folder_usage.recent(storage, experiment, now),
        externals=logs.externals,
    )


def _layout_problems(exchange: Exchange) -> list[str]:
    """The experiment's top folders that are not folders (a file in their place hides everything under them)."""
    root = exchange.layout.root
    return [
        f"{root}/{info.name}: {NOT_A_FOLDER}"
        for info in exchange.entries(root)
        if info.name in TOP_FOLDERS and not info.is_dir
    ]


def reward_rows(exchange: Exchange, bounds: Bounds | None = None) -> list[dict]:
    """One row per valid reward file: node, round, stage, reward, local and external groups, J asked; within
    ``bounds`` (None: every file)."""
    layout, rows = exchange.layout, []
    bounds = Bounds(per_folder=sys.maxsize) if bounds is None else bounds
    for round_name, round_ in bounds.rounds(exchange, layout.rewards_dir):
        for _, stage in bounds.stages(exchange, f"{layout.rewards_dir}/{round_name}"):
            folder = layout.rewards_stage_dir(round_, stage)
            entries = bounds.pick(folder, exchange.node_entries(folder))
            for node, rec in exchange.read_rewards(round_, stage, entries=entries).items():
                rows.append(
                    {
                        "node": node,
                        "round": round_,
                        "stage": stage,
                        "reward": rec.reward,
                        "local_groups": rec.num_local_groups,
                        "external_groups": rec.num_external_groups,
                        "external_requested": rec.external_requested,
                    }
                )
    return rows


def eval_rows(exchange: Exchange, bounds: Bounds | None = None) -> list[dict]:
    """One row per (eval record, task, level): node, round, task, level, n, each accuracy and its standard error;
    within ``bounds`` (None: every file; evals/round_R is the model after R rounds, so up to ``max_rounds``).

    A record written before the SE fields existed gets pass1's and pass_k's from the binomial
    sqrt(p (1 - p) / n), which is what a newer worker writes for them; mean_score's stays empty.
    """
    return [
        {
            "node": rec.node_id,
            "round": rec.round,
            "task": r.task,
            "level": r.level,
            "n": r.n,
            "pass1": r.pass1,
            "pass1_se": r.pass1_se if r.pass1_se is not None else binomial_se(r.pass1, r.n),
            "mean_score": r.mean_score,
            "mean_score_se": r.mean_score_se,
            "k": r.k,
            "pass_k": r.pass_k,
            "pass_k_se": r.pass_k_se if r.pass_k_se is not None or r.pass_k is None else binomial_se(r.pass_k, r.n),
        }
        for rec in _eval_records(exchange, bounds)
        for r in rec.results
    ]


def _eval_records(exchange: Exchange, bounds: Bounds | None):
    if bounds is None:
        return exchange.read_evals()
    records = []
    for round_name, round_ in bounds.rounds(exchange, exchange.layout.evals_dir, slack=1):
        folder = f"{exchange.layout.evals_dir}/{round_name}"
        records += exchange.read_eval_folder(folder, round_, bounds.pick(folder, exchange.node_entries(folder)))
    return records


def binomial_se(p: float, n: int) -> float:
    """Standard error of a pass rate ``p`` over ``n`` questions: sqrt(p (1 - p) / n)."""
    return math.sqrt(max(p * (1.0 - p), 0.0) / n)


def _sorted(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    return df.sort_values(by).reset_index(drop=True) if not df.empty else df


def _rollout_rows(exchange: Exchange, bounds: Bounds) -> list[dict]:
    """One row per valid rollout batch (its groups counted, its size from the listing), within ``bounds``."""
    layout, rows = exchange.layout, []
    for _, round_ in bounds.rounds(exchange, layout.rollouts_dir):
        for _, stage in bounds.stages(exchange, layout.rollouts_round_dir(round_)):
            folder = layout.rollouts_stage_dir(round_, stage)
            entries = bounds.pick(folder, exchange.rollout_entries(round_, stage))  # one listing: sizes too
            for node, batch in exchange.read_rollouts(round_, stage, exclude_self=False, listed=entries).items():
                rows.append(
                    {
                        "round": round_,
                        "stage": stage,
                        "node": node,
                        "groups": len(batch.groups),
                        "bytes": entries[node].size,
                    }
                )
    return rows


# -- findings --------------------------------------------------------------------------------


def findings(snapshot: Snapshot, liveness_timeout: float = LIVENESS) -> list[Finding]:
    """Health findings, most severe first: stale heartbeats, missing rewards and rollouts, error events."""
    out: list[Finding] = [Finding("info", "state", _state_summary(snapshot))]
    out += _coordinator_findings(snapshot)
    out += _heartbeat_findings(snapshot, liveness_timeout)
    out += _missing_reward_findings(snapshot)
    out += _missing_rollout_findings(snapshot)
    out += _advance_findings(snapshot, liveness_timeout)
    out += _storage_findings(snapshot)
    out += _usage_findings(snapshot)
    out += _external_findings(snapshot)
    out += _unreadable_findings(snapshot)
    events = snapshot.events
    if not events.empty:
        errors = events[events["level"] == "error"]
        for node, rows in errors.groupby("node"):
            last = rows.iloc[-1]
            out.append(
                Finding(
                    "error",
                    "error_events",
                    f"{node}: {len(rows)} error event(s); last: {last['event']}: {last['message']}",
                )
            )
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(out, key=lambda f: order[f.severity])


def _state_summary(snapshot: Snapshot) -> str:
    """One line: the state, and the live workers as the coordinator last wrote them, or, once the coordinator is
    gone (stopped, or its peer file says so), the workers whose own heartbeats are fresh. Asynchronous, the
    state's round is no clock: the line says the mode and each worker's own round instead."""
    state = snapshot.state_record
    workers = snapshot.workers()
    if state is None:
        return f"experiment {snapshot.experiment}: no state yet; {len(workers)} worker(s) registered"
    if snapshot.is_async:
        where = (
            f"asynchronous rounds (ROUND_MODE=async: each worker plays its own {state['max_rounds']} round(s), "
            f"{state['num_stages']} stage(s) each)"
        )
    else:
        where = f"round {state['round']} of {state['max_rounds']} ({state['num_stages']} stage(s))"
    gone = _coordinator_gone(snapshot)
    if gone is None:
        live = ", ".join(state["live_workers"]) or "none"
        line = (
            f"experiment {snapshot.experiment}: {state['status']}, {where}, {len(workers)} worker(s) registered, "
            f"live workers: {live}"
        )
    else:
        beating = snapshot.peers[(snapshot.peers["role"] == "worker") & snapshot.peers["alive"]]
        live = ", ".join(sorted(beating["node"])) or "none"
        line = (
            f"experiment {snapshot.experiment}: {state['status']}, {where}, coordinator {state['coordinator_id']} "
            f"{gone}; {len(workers)} worker(s) registered, workers still beating: {live}"
        )
    return line + (f"; {_progress_line(snapshot)}" if snapshot.is_async else "")


#: Workers whose own progress the asynchronous state line names (the rest are counted; the table shows all).
WORKERS_SHOWN = 12
PROGRESS_COLUMNS = ["node", "round", "rounds_played", "done"]


def worker_progress(snapshot: Snapshot) -> pd.DataFrame:
    """Each worker's own progress, what an asynchronous experiment has instead of a round clock: ``round``, its
    peer record's round (the round it plays, or played last; NaN before its first); ``rounds_played``, its rounds
    with a reward for every stage; ``done``, its reward for the last stage of round MAX_ROUNDS - 1 is in (what ends
    a worker's part for the coordinator, GDRIVE_IMPLEMENTATION.md §5.10). One row per registered worker or node
    with rewards, sorted by node."""
    state = snapshot.state_record
    stages = int(state["num_stages"]) if state is not None else 1
    last = int(state["max_rounds"]) - 1 if state is not None else None
    rewards = snapshot.rewards
    peers = snapshot.peers[snapshot.peers["role"] == "worker"] if not snapshot.peers.empty else snapshot.peers
    own_round = dict(zip(peers["node"], peers["round"], strict=True))
    nodes = sorted(set(own_round) | (set(rewards["node"]) if not rewards.empty else set()))
    rows = []
    by_node = dict(iter(rewards.groupby("node"))) if not rewards.empty else {}  # grouped once, not filtered per node
    for node in nodes:
        own = by_node.get(node, rewards.iloc[:0])
        stages_of = own.groupby("round")["stage"].nunique() if not own.empty else pd.Series(dtype=int)
        played = int((stages_of >= stages).sum())
        done = (
            last is not None and not own.empty and bool(((own["round"] == last) & (own["stage"] == stages - 1)).any())
        )
        peer_round = own_round.get(node)
        rows.append(
            {
                "node": node,
                "round": float("nan") if peer_round is None or pd.isna(peer_round) else int(peer_round),
                "rounds_played": played,
                "done": done,
            }
        )
    return pd.DataFrame(rows, columns=PROGRESS_COLUMNS)


def progress_text(row, max_rounds: int) -> str:
    """One worker's own progress in words: ``done, 4 of 4 rounds played``, ``round 2 of 4, 2 played`` (its round
    counts from 0, as the state's round does) or ``not started``."""
    if row.done:
        return f"done, {row.rounds_played} of {max_rounds} rounds played"
    if pd.isna(row.round):
        return "not started"
    return f"round {int(row.round)} of {max_rounds}, {row.rounds_played} played"


def _progress_line(snapshot: Snapshot) -> str:
    state = snapshot.state_record
    assert state is not None
    progress = worker_progress(snapshot)
    if progress.empty:
        return "no worker has started its rounds"
    parts = [f"{row.node} ({progress_text(row, int(state['max_rounds']))})" for row in progress.itertuples()]
    more = f", ... ({len(parts) - WORKERS_SHOWN} more)" if len(parts) > WORKERS_SHOWN else ""
    return f"{int(progress['done'].sum())} of {len(parts)} worker(s) done: " + ", ".join(parts[:WORKERS_SHOWN]) + more


def _coordinator_gone(snapshot: Snapshot) -> str | None:
    """How the experiment's coordinator is gone while the experiment is not finished (None: it is not):
    it wrote the state ``stopped``, or its peer file says it stopped while the state says running."""
    state = snapshot.state_record
    if state is None or state["status"] == "finished":
        return None
    if state["status"] == "stopped":
        return f"stopped {max(0.0, snapshot.now - float(state['updated_at'])):.0f} s ago"
    peers = snapshot.peers
    mine = peers[(peers["node"] == state["coordinator_id"]) & (peers["role"] == "coordinator")]
    if not mine.empty and mine.iloc[0]["status"] == "stopped":
        return f"stopped {max(0.0, snapshot.now - float(mine.iloc[0]['heartbeat_at'])):.0f} s ago (its peer file)"
    return None


def _coordinator_findings(snapshot: Snapshot) -> list[Finding]:
    """The coordinator is gone before the experiment finished: say so, and how to go on."""
    gone = _coordinator_gone(snapshot)
    if gone is None:
        return []
    state = snapshot.state_record
    assert state is not None
    at = "with asynchronous rounds" if snapshot.is_async else f"at round {state['round']}"
    return [
        Finding(
            "warning",
            "coordinator_stopped",
            f"coordinator {state['coordinator_id']} {gone}, {at}: no round advances, and the "
            "workers that followed it checkpoint and exit; start the coordinator again (same GDRIVE_PATH and "
            "EXPERIMENT_NAME) to resume this round, then the workers (they resume from their checkpoints)",
        )
    ]


def _heartbeat_findings(snapshot: Snapshot, liveness_timeout: float) -> list[Finding]:
    out: list[Finding] = []
    state = snapshot.state_record
    for peer in snapshot.peers.itertuples(index=False):
        age = snapshot.now - peer.heartbeat_at
        if peer.status != "alive" or age <= liveness_timeout:
            continue
        if peer.role == "worker":
            out.append(
                Finding(
                    "warning",
                    "stale_heartbeat",
                    f"worker {peer.node}: last heartbeat {age:.0f} s ago (> {liveness_timeout:.0f} s) "
                    f"and it never said it stopped",
                )
            )
        elif state is not None and state["status"] == "running":
            out.append(
                Finding(
                    "error",
                    "coordinator_stale",
                    f"coordinator {peer.node}: last heartbeat {age:.0f} s ago while the experiment is running: "
                    "no round will advance",
                )
            )
    return out


def _advance_findings(snapshot: Snapshot, liveness_timeout: float) -> list[Finding]:
    """A running round whose deadline passed long ago: the coordinator stopped advancing. Asynchronous, no round
    has a deadline (the coordinator's own heartbeat says whether it is there: ``coordinator_stale``)."""
    state = snapshot.state_record
    if state is None or state["status"] != "running" or snapshot.is_async:
        return []
    late = snapshot.now - float(state["round_deadline"])
    if late <= liveness_timeout:
        return []
    return [
        Finding(
            "error",
            "coordinator_not_advancing",
            f"round {state['round']} should have closed {late:.0f} s ago (COORDINATOR_ROUND_INTERVAL): "
            "the coordinator has stopped advancing; restart it (it resumes this round)",
        )
    ]


def _storage_findings(snapshot: Snapshot) -> list[Finding]:
    """How much the shared rollouts take, and a warning when it grows large."""
    rollouts = snapshot.rollouts_per_round
    if rollouts.empty:
        return []
    total = int(rollouts["bytes"].sum())
    rounds = rollouts["round"].nunique()
    message = (
        f"rollouts take {total / 2**20:.1f} MB over {rounds} round(s) (about {total / rounds / 2**20:.2f} MB a round)"
    )
    if total > STORAGE_WARNING_BYTES:
        return [Finding("warning", "storage_growth", message + ": set ROLLOUT_CLEANUP_ENABLED=true to keep the last N")]
    return [Finding("info", "storage", message)]


def _usage_findings(snapshot: Snapshot) -> list[Finding]:
    """The experiment's size and last hour's writes, with the storage's room (info); a warning when that room is
    down to a few checkpoints."""
    if snapshot.usage is None:
        return []
    out = [Finding("info", "experiment_size", folder_usage.describe(snapshot.usage))]
    low = folder_usage.low_space(snapshot.usage)
    return out + ([Finding("warning", "storage_low", low)] if low else [])


def external_per_round(snapshot: Snapshot) -> pd.DataFrame:
    """External groups per worker and round, summed over stages: ``node, round, asked, got`` (J asked, groups
    received), from the reward records; only rounds where the worker asked for some (J > 0)."""
    rewards = snapshot.rewards
    columns = ["node", "round", "asked", "got"]
    if rewards.empty:
        return pd.DataFrame(columns=columns)
    table = (
        rewards.groupby(["node", "round"])[["external_requested", "external_groups"]]
        .sum()
        .reset_index()
        .rename(columns={"external_requested": "asked", "external_groups": "got"})
    )
    return table.loc[table["asked"] > 0, columns].sort_values(["round", "node"]).reset_index(drop=True)


def _external_findings(snapshot: Snapshot) -> list[Finding]:
    """SAPO starvation: workers that trained on fewer external groups than they asked for, never silently."""
    table = external_per_round(snapshot)
    short = table[table["got"] < table["asked"]]
    if short.empty:
        return []
    share = len(short) / len(table)
    rounds = sorted({int(r) for r in short["round"]})
    per_node = short.groupby("node").size()
    worst = ", ".join(f"{node} {count}" for node, count in per_node.sort_values(ascending=False).head(8).items())
    message = (
        f"SAPO got fewer external groups than asked in {len(short)} of {len(table)} worker-rounds "
        f"({share:.0%}; {int(table['got'].sum())} of {int(table['asked'].sum())} groups received; "
        f"round(s) {_ranges(rounds)}; short rounds by worker: {worst}"
        f"{' ...' if len(per_node) > 8 else ''})"
    )
    events = snapshot.events
    expired = int((events["event"] == "rollout_wait_expired").sum()) if not events.empty else 0
    if expired:
        message += (
            f": {expired} gather(s) gave up waiting for peers' rollouts (ROLLOUT_WAIT_TIMEOUT): on a Drive mount "
            "set SYNC_LAG to its lag, or raise ROLLOUT_WAIT_TIMEOUT"
        )
    else:
        message += ": the peers' rollouts offered too few groups with reward variance (or peers were missing)"
    severity = "warning" if share >= SAPO_SHORTFALL_WARNING else "info"
    return [Finding(severity, "sapo_starved" if severity == "warning" else "sapo_shortfall", message)]


def _closed_rounds(snapshot: Snapshot) -> int:
    """Rounds before the current one (all of them once finished)."""
    state = snapshot.state_record
    return int(state["round"]) if state is not None else 0


def _missing_reward_findings(snapshot: Snapshot) -> list[Finding]:
    rewards = snapshot.rewards
    if rewards.empty:
        return []
    state = snapshot.state_record
    stages = int(state["num_stages"]) if state is not None else 1
    current = min(_closed_rounds(snapshot), int(rewards["round"].max()) + 1)
    done = set(worker_progress(snapshot).query("done")["node"]) if snapshot.is_async else set()
    rewarded = {int(r) for r in rewards["round"]}
    out: list[Finding] = []
    for node, rows in rewards.groupby("node"):
        have = set(zip(rows["round"], rows["stage"], strict=True))
        if snapshot.is_async:  # its own clock: every round before the one it plays, all of them once it is done
            current = int(rows["round"].max()) + (node in done)
        first = int(rows["round"].min())  # a late joiner is not expected before its first round
        # Every round since the first; with a far-off (forged) round in the folder, the rounds anyone was rewarded in.
        rounds = range(first, current) if (current - first) * stages <= MAX_CELLS_CHECKED else sorted(rewarded)
        missing = sorted({r for r in rounds if first <= r < current for s in range(stages) if (r, s) not in have})
        if missing:
            out.append(
                Finding("warning", "missing_reward", f"worker {node}: no reward for round(s) {_ranges(missing)}")
            )
    return out


def _missing_rollout_findings(snapshot: Snapshot) -> list[Finding]:
    """A worker that submitted a reward with J > 0 but has no rollouts in that round.

    Only rounds where some node's rollouts are still present, and that are newer than the worker's oldest
    rollouts still present, are checked: retention (ROLLOUT_CLEANUP_ENABLED) removes each worker's oldest
    rounds, at its own pace, and on a mount that syncs late its removals arrive at different times, so a
    round may hold some workers' files and not others'; that is not a fault. A gap is.
    """
    if _config_int(snapshot, "num_transplant_trees") <= 0 or snapshot.rewards.empty:
        return []
    rollouts = snapshot.rollouts_per_round
    present_rounds = set(rollouts["round"]) if not rollouts.empty else set()
    out: list[Finding] = []
    for node, rows in snapshot.rewards.groupby("node"):
        own = set(rollouts.loc[rollouts["node"] == node, "round"]) if not rollouts.empty else set()
        oldest = min(own, default=-1)  # rounds below it: this worker's retention (or none of its files at all)
        missing = sorted(r for r in set(rows["round"]) if r in present_rounds and r not in own and r > oldest)
        if missing:
            out.append(
                Finding(
                    "warning",
                    "missing_rollouts",
                    f"worker {node}: submitted rewards but shared no valid rollouts in round(s) {_ranges(missing)}",
                )
            )
    return out


def _ranges(values: list[int]) -> str:
    shown = ", ".join(str(v) for v in values[:ROUNDS_SHOWN])
    return shown + (f" ... ({len(values)} in all)" if len(values) > ROUNDS_SHOWN else "")


def _unreadable_findings(snapshot: Snapshot) -> list[Finding]:
    """What the monitor could not read (rejected files, bad log lines, metric keys over the caps)."""
    problems = snapshot.problems
    if not problems:
        return []
    shown = "; ".join(printable(p) for p in problems[:PROBLEMS_SHOWN])
    more = f"; ... ({len(problems) - PROBLEMS_SHOWN} more)" if len(problems) > PROBLEMS_SHOWN else ""
    return [
        Finding(
            "warning",
            "unreadable",
            f"{len(problems)} file(s) or line(s) could not be read and were left out: {shown}{more}: a node that "
            "crashed mid-append leaves at most a partial last line, a reset a few files of the old run; anything "
            "else was written by something other than this run's nodes: find out who else writes to the folder",
        )
    ]


def _config_int(snapshot: Snapshot, key: str) -> int:
    """An integer setting of experiment.json's config, 0 when absent or not an integer."""
    value = snapshot.config.get(key)
    return value if type(value) is int else 0


# -- the TEST_MODE validator -----------------------------------------------------------------


def checks(snapshot: Snapshot, rounds: int, nodes: int, transplants: int) -> list[tuple[str, list[str]]]:
    """Every check of :func:`validate` by name, with its failures (empty when it passed)."""
    state = snapshot.state_record
    workers = snapshot.workers()
    result: list[tuple[str, list[str]]] = []

    if state is None:
        result.append(("state finished", ["no valid state file"]))
    else:
        bad = []
        if state["status"] != "finished" or state["round"] < rounds:
            bad.append(f"state is {state['status']} at round {state['round']}, expected finished at round {rounds}")
        result.append((f"state finished after {rounds} rounds", bad))

    bad = (
        [] if len(workers) == nodes else [f"{len(workers)} workers registered ({', '.join(workers)}), expected {nodes}"]
    )
    result.append((f"{nodes} workers registered", bad))

    have = set(zip(snapshot.rewards["node"], snapshot.rewards["round"], strict=True))
    bad = [f"no reward from {w} for round {r}" for w in workers for r in range(rounds) if (w, r) not in have]
    result.append(("a reward per worker per round", bad))

    if transplants > 0:
        rollouts = snapshot.rollouts_per_round
        shared = set(zip(rollouts["node"], rollouts["round"], strict=True))
        bad = [
            f"no valid rollout file from {w} for round {r}"
            for w in workers
            for r in range(rounds)
            if (w, r) not in shared
        ]
        result.append(("a rollout file per worker per round", bad))
        rewards = snapshot.rewards
        used = set(rewards.loc[rewards["external_groups"] > 0, "node"])
        bad = [f"{w} never trained on external groups" for w in workers if w not in used]
        result.append(("every worker used external groups", bad))

    bad = [
        f"{w} has no logs/{w}/{name}"
        for w in workers
        for name in LOG_FILES
        if name not in snapshot.log_files.get(w, ())
    ]
    result.append(("logs present", bad))

    events = snapshot.events
    errors = events[events["level"] == "error"] if not events.empty else events
    bad = [f"{e.node}: {e.event}: {e.message}" for e in errors.itertuples(index=False)]
    result.append(("no error events", bad))
    return result


def validate(snapshot: Snapshot, rounds: int, nodes: int, transplants: int) -> list[str]:
    """The TEST_MODE validator: a message per failed check, empty when every check passes."""
    return [f"{name}: {msg}" for name, failures in checks(snapshot, rounds, nodes, transplants) for msg in failures]


# -- commands --------------------------------------------------------------------------------


def status_table(snapshot: Snapshot) -> str:
    """The per-worker table of ``swarm-gdrive status``. Asynchronous, its round is the worker's own (``2 of 4``)
    and a ``done`` column says whether it has played them all."""
    asynchronous = snapshot.is_async
    header = ["worker", "status", "alive", "heartbeat", "round", "rewarded rounds", "reward (last 5)"]
    if asynchronous:
        header[4:5] = ["own round", "done"]
        state = snapshot.state_record
        assert state is not None
        progress = worker_progress(snapshot)
        done = dict(zip(progress["node"], progress["done"], strict=True))
    lines = [header]
    rewards = snapshot.rewards
    # Each worker's mean reward per round, grouped once (a filter per worker is quadratic in a flooded folder).
    by_node = (
        {node: rows.groupby("round")["reward"].mean().sort_index() for node, rows in rewards.groupby("node")}
        if not rewards.empty
        else {}
    )
    for peer in snapshot.peers[snapshot.peers["role"] == "worker"].itertuples(index=False):
        per_round = by_node.get(peer.node, pd.Series(dtype=float))
        last5 = f"{per_round.tail(5).mean():.3f}" if len(per_round) else "-"
        round_ = "-" if pd.isna(peer.round) else str(int(peer.round))
        line = [peer.node, peer.status, "yes" if peer.alive else "no", f"{snapshot.now - peer.heartbeat_at:.0f} s ago"]
        if asynchronous:
            line += [
                round_ if round_ == "-" else f"{round_} of {state['max_rounds']}",
                "yes" if done[peer.node] else "no",
            ]
        else:
            line.append(round_)
        lines.append([*line, str(len(per_round)), last5])
    text = _columns(lines)
    external = _external_table(snapshot)
    staleness = _external_worker_table(snapshot) if asynchronous else ""
    return text + "".join("\n\n" + part for part in (external, staleness) if part)


def _columns(lines: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in lines)


def _external_table(snapshot: Snapshot) -> str:
    """External groups received/asked (J) per worker for the last rounds; '!' marks a shortfall."""
    table = external_per_round(snapshot)
    if table.empty:
        return ""
    workers = sorted(table["node"].unique())
    rounds = sorted(table["round"].unique())[-EXTERNAL_ROUNDS_SHOWN:]
    cells = {(row.node, row.round): (int(row.got), int(row.asked)) for row in table.itertuples(index=False)}
    lines = [["round", *workers]]
    for r in rounds:
        row = [str(int(r))]
        for w in workers:
            got, asked = cells.get((w, r), (None, None))
            row.append("-" if got is None else f"{got}/{asked}" + (" !" if got < asked else ""))
        lines.append(row)
    short = int((table["got"] < table["asked"]).sum())
    title = (
        f"external groups received/asked (J) per round, last {len(rounds)} round(s); "
        f"short in {short} of {len(table)} worker-rounds"
    )
    if snapshot.is_async:
        title += " (each worker's own rounds: the same round number is not the same moment)"
    return title + "\n" + _columns(lines)


EXTERNAL_WORKER_COLUMNS = [
    "node",
    "rounds",
    "asked",
    "got",
    "fill",
    "age_s_median",
    "age_s_max",
    "staleness_rounds_median",
    "staleness_rounds_max",
]


def external_per_worker(snapshot: Snapshot) -> pd.DataFrame:
    """Per worker, over its rounds that asked for external groups (J > 0): ``rounds``, ``asked``, ``got`` and the
    fill rate ``fill`` = got / asked (reward records); and, from the asynchronous ``externals_taken`` events, the
    median and largest age of the groups it trained on (seconds from the batch's ``created_at`` to the pickup, on
    the taker's clock) and their staleness in its own rounds (NaN without such events: the synchronous gather
    takes the round's own rollouts)."""
    table = external_per_round(snapshot)
    if table.empty:
        return pd.DataFrame(columns=EXTERNAL_WORKER_COLUMNS)
    out = table.groupby("node").agg(rounds=("round", "nunique"), asked=("asked", "sum"), got=("got", "sum"))
    out["fill"] = out["got"] / out["asked"]
    taken = snapshot.externals
    if not taken.empty:
        by_node = taken.groupby("node")
        out["age_s_median"] = by_node["age_s"].median()
        out["age_s_max"] = by_node["age_s"].max()
        out["staleness_rounds_median"] = by_node["staleness_rounds"].median()
        out["staleness_rounds_max"] = by_node["staleness_rounds"].max()
    return out.reset_index().reindex(columns=EXTERNAL_WORKER_COLUMNS)


def _external_worker_table(snapshot: Snapshot) -> str:
    """:func:`external_per_worker` as text: fill rate and staleness of what each worker trained on."""
    table = external_per_worker(snapshot)
    if table.empty:
        return ""

    def num(value: float, fmt: str) -> str:
        return "-" if pd.isna(value) else fmt.format(value)

    lines = [["worker", "rounds", "received/asked", "fill", "age s (median, max)", "staleness rounds (median, max)"]]
    for row in table.itertuples(index=False):
        lines.append(
            [
                row.node,
                str(int(row.rounds)),
                f"{int(row.got)}/{int(row.asked)}",
                f"{row.fill:.0%}",
                f"{num(row.age_s_median, '{:.1f}')}, {num(row.age_s_max, '{:.1f}')}",
                f"{num(row.staleness_rounds_median, '{:g}')}, {num(row.staleness_rounds_max, '{:g}')}",
            ]
        )
    title = (
        "external groups per worker: fill (received/asked) and staleness of those taken (age on the taker's clock, "
        "staleness in its own rounds)"
    )
    return title + "\n" + _columns(lines)


def summary_table(storage: Storage, experiment: str) -> str:
    """Reward per worker per round, with external groups used, from the experiment's reward files; in an asynchronous
    experiment a column is each worker's own round (the same number is not the same moment)."""
    exchange = Exchange(storage, Layout(experiment), "summary")
    record = exchange.read_experiment()
    label = "own round" if record is not None and record.mode == "async" else "round"
    rows: dict[str, dict[int, str]] = {}
    for row in reward_rows(exchange):
        rows.setdefault(row["node"], {})[row["round"]] = f"{row['reward']:.3f} ({row['external_groups']} ext)"
    rounds = sorted({r for cells in rows.values() for r in cells})
    header = ["node"] + [f"{label} {r}" for r in rounds]
    lines = [header] + [[node] + [cells.get(r, "-") for r in rounds] for node, cells in sorted(rows.items())]
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in lines)


def list_experiments(storage: Storage) -> list[str]:
    """Names of the experiment folders under ``experiments/``, sorted.

    A folder whose name no experiment can have (``My Run``, ``Exp``, ``con``; a name that is not UTF-8 the
    storage already leaves out) is left out with a WARNING, once per name: a reader could not load it, and a page that
    chose it first would fail for every experiment of the folder."""
    try:
        listing = storage.list("experiments")
    except StorageUnavailableError:
        raise
    except OSError:  # refused (a link, a file where the folder belongs): no experiment there to read
        return []
    names = []
    for info in listing:
        if not info.is_dir:
            continue
        try:
            names.append(validate_name(info.name, "EXPERIMENT_NAME"))
        except InvalidNameError as exc:
            if info.name not in _not_experiments and len(_not_experiments) < 10_000:
                _not_experiments.add(info.name)
                logger.warning("experiments/%s: not an experiment, left out: %s", escaped_name(info.name), exc.fix)
    return sorted(names)


def unknown_experiments_message(storage: Storage, names: list[str], where: str) -> str | None:
    """None when every experiment of ``names`` exists in ``storage``; else a one-line error that lists the
    experiments that do exist (a misspelt name should not read as an empty experiment)."""
    existing = list_experiments(storage)
    missing = [name for name in names if name not in existing]
    if not missing:
        return None
    there = ", ".join(existing) if existing else "none yet (a coordinator creates one when it starts)"
    return f"no experiment {', '.join(map(repr, missing))} in {where}; experiments there: {there}"
