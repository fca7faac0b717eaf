"""One SIGKILL/restart trial: a real swarm, one node parked at a fault point and killed there, restarted
with the same identity, and every property of the suite checked. Used by the tests and by run_trials.py."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from faultkit import (
    LAYOUT,
    Swarm,
    Watcher,
    assert_every_round_submitted,
    assert_swarm_finished,
    events,
    faults,
    kill_parked,
    leftovers,
    metrics,
    played_rounds,
    read_record,
    rejections,
    rewards_present,
    skipped_rounds,
    swarm_env,
    wait_until,
)

from swarm_gdrive.protocol.records import StateRecord

WORKERS = ["w1", "w2", "w3"]
ROUNDS = 4
WORKER_POINTS = ("generate", "publish", "train", "submit", "flush", "random")
COORDINATOR_POINTS = ("state", "flush", "random")


@dataclass
class KillResult:
    victim: str
    point: str
    round: int
    seconds: float
    resumed_at: int | None
    lost: int


def run_kill_trial(
    tmp: Path, victim: str, point: str, round_: int, publish: str = "stage", seed: int = 0, sink=None
) -> KillResult:
    """Kill ``victim`` (``coord`` or a worker) at ``point`` of ``round_``, restart it, check everything.

    ``point`` ``random`` kills it at a random moment of ``round_`` instead of a hooked point.
    Raises AssertionError when any property fails; returns what happened otherwise.
    """
    folder = tmp / "drive"
    folder.mkdir(parents=True)
    marker = tmp / "marker"
    env = swarm_env(folder, MAX_ROUNDS=ROUNDS, MIN_WORKERS=len(WORKERS), ROLLOUT_PUBLISH_FREQUENCY=publish)
    extra = {}
    if point != "random":
        extra[victim] = faults(park={"point": point, "round": round_, "dir": str(marker)})
    swarm = Swarm(folder, env, WORKERS, extra, sink=sink)
    torn_ok = point in ("flush", "random")  # a kill mid-append may leave one partial line in the victim's logs
    logs = {LAYOUT.metrics_file(victim), LAYOUT.events_file(victim)}
    watcher = Watcher(folder, torn_ok=logs if torn_ok else set())
    started = time.monotonic()
    try:
        watcher.start()
        swarm.start_all()
        proc = swarm.procs[0] if victim == "coord" else swarm.procs[1 + WORKERS.index(victim)]
        if point == "random":
            _kill_at_random(swarm, proc, victim, round_, random.Random(seed))
        else:
            assert kill_parked(swarm, proc, marker) == point
        killed_at = time.time()
        state_at_kill = _state(folder)
        before = {w: rewards_present(folder, w) for w in WORKERS}
        swarm.start(f"{victim}#2", node=victim)
        codes = swarm.wait(timeout=180)
    finally:
        swarm.stop()
        watcher.stop()
    expected = {p.name: 0 for p in swarm.procs if p is not proc}
    assert codes == expected, f"exit codes {codes}\n{swarm.tails()}"
    watcher.assert_clean()
    assert_swarm_finished(folder, ROUNDS)
    assert not leftovers(folder), f"temporaries left behind: {leftovers(folder)}"
    for node in ["coord", *WORKERS]:
        torn = torn_ok and node == victim
        assert not rejections(folder, node, torn), f"{node} rejected an honest file: {rejections(folder, node, torn)}"
        metrics(folder, node, torn)  # every line of every log parses (but a partial one the kill left)
    lost = 0
    for w in WORKERS:
        after = rewards_present(folder, w)
        lost += sum(1 for r, rec in before[w].items() if after.get(r) is None or after[r].run_id != rec.run_id)
        skipped = skipped_rounds(folder, w) if w == victim else set()
        assert_every_round_submitted(folder, w, range(ROUNDS), skipped)
    assert lost == 0
    resumed_at = _check_restart(folder, victim, state_at_kill, killed_at, point)
    _check_cleanup(swarm, folder, victim, point)
    return KillResult(victim, point, round_, time.monotonic() - started, resumed_at, lost)


def _check_cleanup(swarm: Swarm, folder: Path, victim: str, point: str) -> None:
    """A kill mid-write left a half-written temporary; the restarted node (its only writer) removed it."""
    if point not in ("publish", "submit", "state"):
        return
    if victim == "coord":
        assert any("removed 1 temporary files" in line for line in swarm.procs[-1].lines), swarm.tails()
    else:
        cleaned = [e.data["count"] for e in events(folder, victim) if e.event == "temporaries_removed"]
        assert cleaned == [1], cleaned


def _state(folder: Path) -> StateRecord | None:
    try:
        return read_record(folder, LAYOUT.state_file, StateRecord)
    except FileNotFoundError:
        return None


def _kill_at_random(swarm: Swarm, proc, victim: str, round_: int, rng: random.Random) -> None:
    """SIGKILL at a random moment after round ``round_`` opened (0-0.6 s in; a round takes about a second)."""
    state = swarm.path(LAYOUT.state_file)

    def opened() -> bool:
        try:
            return f'"round":{round_},' in state.read_text() and '"status":"running"' in state.read_text()
        except FileNotFoundError:
            return False

    wait_until(opened, 90, f"round {round_}", swarm.procs)
    time.sleep(rng.uniform(0.0, 0.6))  # the randomised kill moment itself, not a synchronisation
    proc.kill()


def _check_restart(folder: Path, victim: str, state_at_kill: StateRecord | None, killed_at: float, point: str) -> int:
    """The restarted node took up where the killed one stopped; returns the round it resumed at.

    A worker goes on with the round after the last one whose log it flushed (or skips ahead with a
    ``round_skipped`` event); after a kill at a random moment it may also replay that last round,
    when the kill fell between the log flush and the local progress mark. A coordinator resumes at
    the round of the state file it left.
    """
    torn_ok = point in ("flush", "random")
    if victim == "coord":
        resumed = [e for e in events(folder, "coord", torn_ok) if e.event == "coordinator_resumed"]
        assert len(resumed) == 1, resumed
        assert state_at_kill is not None and resumed[0].round == state_at_kill.round, (resumed, state_at_kill)
        return resumed[0].round
    # The killed process's events of its last round were buffered, not flushed: its start may be missing.
    log = events(folder, victim, torn_ok)
    starts = [e for e in log if e.event == "worker_started"]
    assert starts and starts[-1].ts > killed_at, starts
    restart = starts[-1].ts
    completed = [m.round for m in metrics(folder, victim, torn_ok) if m.ts < restart and "round/seconds" in m.values]
    expected = max(completed) + 1 if completed else 0
    allowed = {expected} if point != "random" else {expected, expected - 1}
    after = played_rounds(folder, victim, after=restart, torn_ok=torn_ok)
    assert after, f"{victim} played nothing after its restart"
    skips = [e for e in log if e.event == "round_skipped" and e.ts >= restart]
    if skips:
        assert skips[0].data["skipped_from"] in allowed and after[0] == skips[0].data["skipped_to"] + 1, (skips, after)
    else:
        assert after[0] in allowed, (completed, after)
    return after[0]


def run_oserror_trial(tmp: Path, seed: int, sink=None) -> Counter[str]:
    """Every node's local backend fails about one call in 12, in bursts of 1-4 calls (within the retry
    budget), with EIO or ENOTCONN; the swarm must finish with nothing lost. Returns the errors injected."""
    folder = tmp / "drive"
    folder.mkdir(parents=True)
    injected = tmp / "injected"
    # A node riding out bursts sleeps in backoff, its heartbeat thread too: seconds without a heartbeat.
    env = swarm_env(folder, MAX_ROUNDS=ROUNDS, MIN_WORKERS=len(WORKERS), LIVENESS_TIMEOUT=30)
    extra = {
        node: faults(oserror={"every": 12, "burst": 1 + (seed + i) % 4, "seed": seed * 100 + i, "dir": str(injected)})
        for i, node in enumerate(["coord", *WORKERS])
    }
    swarm = Swarm(folder, env, WORKERS, extra, sink=sink)
    watcher = Watcher(folder)
    try:
        watcher.start()
        swarm.start_all()
        codes = swarm.wait(timeout=180)
    finally:
        swarm.stop()
        watcher.stop()
    assert codes == {"coord": 0, **{w: 0 for w in WORKERS}}, swarm.tails()
    errors = [json.loads(line) for f in injected.glob("*.log") for line in f.read_text().splitlines()]
    assert {"_read", "_write", "_list"} <= {e["op"] for e in errors}, Counter(e["op"] for e in errors)
    retried = [line for p in swarm.procs for line in p.lines if "Retrying" in line]
    assert any("Transport endpoint is not connected" in line for line in retried)
    assert any("Input/output error" in line for line in retried)
    watcher.assert_clean()
    assert_swarm_finished(folder, ROUNDS)
    assert not leftovers(folder), leftovers(folder)
    for w in WORKERS:
        assert_every_round_submitted(folder, w, range(ROUNDS))
    for node in ["coord", *WORKERS]:
        assert not rejections(folder, node)
        metrics(folder, node)
    return Counter(e["errno"] for e in errors)
