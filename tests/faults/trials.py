"""One SIGKILL/restart trial: a real swarm, one node parked at a fault point and killed there, restarted
with the same identity, and every property of the suite checked. Used by the tests and by run_trials.py."""

from __future__ import annotations

import json
import os
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from faultkit import (
    EXPERIMENT,
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
    round_reached,
    skipped_rounds,
    swarm_env,
    wait_until,
)
from hostile_mix import Planted, Planter, Scene

from swarm_gdrive.protocol.layout import parse_round_dir
from swarm_gdrive.protocol.records import ExperimentRecord, RecordError, RewardRecord, StateRecord, decode
from swarm_gdrive.protocol.signing import signed_by
from swarm_gdrive.storage import LocalStorage

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
    tmp: Path,
    victim: str,
    point: str,
    round_: int,
    publish: str = "stage",
    seed: int = 0,
    sink=None,
    round_mode: str = "sync",
) -> KillResult:
    """Kill ``victim`` (``coord`` or a worker) at ``point`` of ``round_``, restart it, check everything.

    ``point`` ``random`` kills it at a random moment of ``round_`` instead of a hooked point. ``round_mode``: the
    coordinator's ROUND_MODE; in ``async`` a round is the victim's own (any worker's for the coordinator), and the
    coordinator's state is written at the start and at the finish only (its round 0, then MAX_ROUNDS).
    Raises AssertionError when any property fails; returns what happened otherwise.
    """
    folder = tmp / "drive"
    folder.mkdir(parents=True)
    marker = tmp / "marker"
    env = swarm_env(folder, MAX_ROUNDS=ROUNDS, MIN_WORKERS=len(WORKERS), ROLLOUT_PUBLISH_FREQUENCY=publish)
    extra = {}
    if point != "random":
        extra[victim] = faults(park={"point": point, "round": round_, "dir": str(marker)})
    swarm = Swarm(folder, env, WORKERS, extra, sink=sink, round_mode=round_mode)
    torn_ok = point in ("flush", "random")  # a kill mid-append may leave one partial line in the victim's logs
    logs = {LAYOUT.metrics_file(victim), LAYOUT.events_file(victim)}
    watcher = Watcher(folder, torn_ok=logs if torn_ok else set())
    started = time.monotonic()
    try:
        watcher.start()
        swarm.start_all()
        proc = swarm.procs[0] if victim == "coord" else swarm.procs[1 + WORKERS.index(victim)]
        if point == "random":
            _kill_at_random(swarm, proc, victim, round_, random.Random(seed), round_mode)
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
    assert_swarm_finished(folder, ROUNDS, round_mode)
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
    if round_mode == "async":  # each worker its own rounds: the others played each once, the victim went on to the end
        for w in WORKERS:
            torn = torn_ok and w == victim
            after = played_rounds(folder, w, after=killed_at if w == victim else 0.0, torn_ok=torn)
            assert after == list(range(after[0] if w == victim else 0, ROUNDS)), (w, after)
    _check_cleanup(swarm, folder, victim, point)
    return KillResult(victim, point, round_, time.monotonic() - started, resumed_at, lost)


def _check_cleanup(swarm: Swarm, folder: Path, victim: str, point: str) -> None:
    """A kill mid-write left a half-written temporary; the restarted node (its only writer) removed it, and with it
    any other its killed process left (a heartbeat or log flush caught mid-write at the same instant), so none of
    its temporaries is left in the shared folder."""
    if point not in ("publish", "submit", "state"):
        return
    if victim == "coord":
        said = [re.search(r"removed (\d+) temporary files", line) for line in swarm.procs[-1].lines]
        cleaned = [int(m.group(1)) for m in said if m]
    else:
        cleaned = [e.data["count"] for e in events(folder, victim) if e.event == "temporaries_removed"]
    assert len(cleaned) == 1 and cleaned[0] >= 1, (cleaned, swarm.tails())
    left = [str(p.relative_to(folder)) for p in folder.rglob(".*.tmp") if p.is_file()]
    assert not left, f"temporaries left after {victim}'s restart: {left}"


def _state(folder: Path) -> StateRecord | None:
    try:
        return read_record(folder, LAYOUT.state_file, StateRecord)
    except FileNotFoundError:
        return None


def _kill_at_random(swarm: Swarm, proc, victim: str, round_: int, rng: random.Random, round_mode: str = "sync") -> None:
    """SIGKILL at a random moment after round ``round_`` opened (0-0.6 s in; a round takes about a second); in
    async, after ``victim`` (any worker, for the coordinator) began its round ``round_``."""
    wait_until(lambda: round_reached(swarm.folder, round_, round_mode, victim), 90, f"round {round_}", swarm.procs)
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
        log = events(folder, "coord", torn_ok)
        resumed = [e for e in log if e.event == "coordinator_resumed"]
        assert len(resumed) == 1, resumed
        recovered = [e for e in log if e.event == "state_recovered" and e.ts > killed_at]
        if recovered:  # the state it found was not one to resume from (planted, unreadable): it said where it went on
            assert resumed[0].round == recovered[-1].round, (resumed, recovered)
            return resumed[0].round
        experiment = read_record(folder, LAYOUT.experiment_file, ExperimentRecord)
        genuine = state_at_kill is not None and state_at_kill.run_id == experiment.run_id
        genuine = genuine and state_at_kill.coordinator_id == "coord"
        if genuine and experiment.public_key is not None:  # a copy in the coordinator's name, unsigned: planted
            genuine = signed_by(state_at_kill, experiment.public_key)
        if not genuine:
            return resumed[0].round  # unreadable or planted at the kill, and gone by the restart: nothing to compare
        assert resumed[0].round == state_at_kill.round, (resumed, state_at_kill)
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
    skips = [e for e in log if e.event == "round_skipped" and e.ts >= restart]
    if not after:  # the experiment finished while it was away (async ends without a dead worker), and it says so
        gone = set(range(skips[0].data["skipped_from"], ROUNDS)) if skips else {-1}
        assert gone <= skipped_rounds(folder, victim, torn_ok), f"{victim} played nothing after its restart: {skips}"
        assert skips[0].data["skipped_from"] in allowed, (completed, skips)
        return skips[0].data["skipped_from"]
    if skips:
        assert skips[0].data["skipped_from"] in allowed and after[0] == skips[0].data["skipped_to"] + 1, (skips, after)
    else:
        assert after[0] in allowed, (completed, after)
    return after[0]


def run_oserror_trial(tmp: Path, seed: int, sink=None, round_mode: str = "sync") -> Counter[str]:
    """Every node's local backend fails about one call in 12, in bursts of 1-4 calls (within the retry
    budget), with EIO or ENOTCONN; the swarm (the coordinator's ROUND_MODE ``round_mode``) must finish with nothing
    lost. Returns the errors injected."""
    folder = tmp / "drive"
    folder.mkdir(parents=True)
    injected = tmp / "injected"
    # A node riding out bursts sleeps in backoff, its heartbeat thread too: seconds without a heartbeat.
    env = swarm_env(folder, MAX_ROUNDS=ROUNDS, MIN_WORKERS=len(WORKERS), LIVENESS_TIMEOUT=30)
    extra = {
        node: faults(oserror={"every": 12, "burst": 1 + (seed + i) % 4, "seed": seed * 100 + i, "dir": str(injected)})
        for i, node in enumerate(["coord", *WORKERS])
    }
    swarm = Swarm(folder, env, WORKERS, extra, sink=sink, round_mode=round_mode)
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
    assert_swarm_finished(folder, ROUNDS, round_mode)
    assert not leftovers(folder), leftovers(folder)
    for w in WORKERS:
        assert_every_round_submitted(folder, w, range(ROUNDS))
        assert played_rounds(folder, w) == list(range(ROUNDS)), w  # each round once, none skipped
    for node in ["coord", *WORKERS]:
        assert not rejections(folder, node)
        metrics(folder, node)
    return Counter(e["errno"] for e in errors)


# -- randomised trials that mix hostile files with kills ---------------------------------------------------------


@dataclass
class MixedResult:
    """One mixed trial: the counts the issue asks for, and any other property that failed."""

    cls: str
    planted: str
    victim: str
    kill_round: int
    plant_round: int
    crashes: list[str] = field(default_factory=list)  # nodes that exited 1, readers that raised
    lost: int = 0  # submissions present at the kill and gone at the end, plus rounds a never-killed worker lacks
    outside_bytes: int = 0  # bytes written outside GDRIVE_PATH (through links planted inside it)
    early_exits: list[str] = field(default_factory=list)  # workers that exited 0 with rounds of theirs not submitted
    unable_to_restart: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: The run id of the rival coordinator's new run when it came too late and reset the finished run (the
    #: operator's reset, undone for the judge: :func:`_undo_a_reset_after_the_end`); None otherwise.
    reset_after_the_end: str | None = None

    @property
    def ok(self) -> bool:
        bad = self.crashes or self.lost or self.outside_bytes or self.early_exits
        return not (bad or self.unable_to_restart or self.problems)


class MixedWatcher(Watcher):
    """The suite's watcher, keeping what it found per path: what a planter planted is only known once it returns,
    so failures on hostile paths and forged states are filtered out at the end (:meth:`problems`)."""

    def __init__(self, folder: Path, torn_ok: set[str]) -> None:
        super().__init__(folder, torn_ok=torn_ok)
        self.failures: list[tuple[str, str]] = []
        self.state_log: list[tuple[int, int, str]] = []

    def sweep(self, rel: str) -> None:
        try:
            infos = self.storage.list(rel)
        except Exception as exc:  # noqa: BLE001 - a hostile folder; judged at the end
            self.failures.append((rel, f"listing failed: {type(exc).__name__}: {exc}"))
            return
        for info in infos:
            path = f"{rel}/{info.name}"
            if info.is_dir:
                if not path.endswith("/checkpoints"):
                    self.sweep(path)
            else:
                self.check(path)

    def check(self, path: str) -> None:
        before = len(self.torn)
        try:
            if path == LAYOUT.state_file:
                record = decode(self.storage.read_bytes(path, 1 << 20), StateRecord)
                if not self.state_log or self.state_log[-1][:2] != (record.round, record.seq):
                    self.state_log.append((record.round, record.seq, record.run_id))
                self.reads += 1
            else:
                super().check(path)
        except FileNotFoundError:
            return
        except Exception as exc:  # noqa: BLE001 - judged at the end, with the planted paths known
            self.failures.append((path, f"{type(exc).__name__}: {exc}"))
        self.failures.extend((path, message) for message in self.torn[before:])
        del self.torn[before:]

    def problems(
        self, hostile: set[str], forged: set[tuple[int, int, str]], forged_runs: frozenset[str] = frozenset()
    ) -> list[str]:
        out = [f"a reader saw {path}: {msg}" for path, msg in self.failures if not _under(path, hostile)]
        order = [(r, s) for r, s, run in self.state_log if (r, s, run) not in forged and run not in forged_runs]
        if order != sorted(order):
            out.append(f"the state went backwards: {self.state_log}")
        if not self.reads:
            out.append("the watcher read nothing")
        return out


def _under(path: str, prefixes: set[str]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in prefixes)


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (links not followed) and its bytes."""
    out = {}
    for d, dirs, files in os.walk(folder):
        for name in files + [x for x in dirs if Path(d, x).is_symlink()]:
            path = Path(d, name)
            out[str(path.relative_to(folder))] = path.read_bytes() if path.is_file() else b"<link>"
    return out


def run_mixed_trial(tmp: Path, cls: str, seed: int, sink=None, round_mode: str = "sync") -> MixedResult:
    """A swarm of real processes (coordinator, 3 workers, 4 rounds); a hostile file of class ``cls`` (see
    hostile_mix.CLASSES) planted at a random moment, and a random node SIGKILLed at another and restarted.
    ``round_mode``: the coordinator's ROUND_MODE; in async, "round R" is a round of the victim (any worker's, for the
    coordinator and for the planter).

    Never raises for a property of the swarm: every failure is in the result (``ok`` False).
    """
    rng = random.Random(seed)
    folder, outside = tmp / "drive", tmp / "outside"
    folder.mkdir(parents=True)
    outside.mkdir()
    (outside / "sentinel.txt").write_text("outside GDRIVE_PATH: no node may write here\n")
    before_outside = _snapshot(outside)
    victim = rng.choice(["coord", *WORKERS])
    spare = rng.choice([w for w in WORKERS if w != victim])
    result = MixedResult(cls, "", victim, rng.randrange(ROUNDS - 1), rng.randrange(ROUNDS - 1))
    cleanup = cls.startswith("type_confusion") or rng.random() < 0.5
    env = swarm_env(
        folder,
        MAX_ROUNDS=ROUNDS,
        MIN_WORKERS=len(WORKERS),
        ROLLOUT_PUBLISH_FREQUENCY=rng.choice(("generation", "stage", "round")),
        ROLLOUT_CLEANUP_ENABLED=str(cleanup).lower(),
        ROLLOUT_KEEP_LAST_N_ROUNDS=1,
        COORDINATOR_WAIT_TIMEOUT=60,  # a worker left without a coordinator gives up within the trial's wait
        SEED=rng.randrange(1000),
    )
    # Every draw is made here, before the threads start: a trial is reproducible from its seed.
    plant_rng, kill_rng, plant_delay = random.Random(rng.random()), random.Random(rng.random()), rng.uniform(0, 0.8)
    swarm = Swarm(folder, env, WORKERS, sink=sink, round_mode=round_mode)
    watcher = MixedWatcher(folder, torn_ok={LAYOUT.metrics_file(victim), LAYOUT.events_file(victim)})
    started = time.monotonic()
    planter: Planter | None = None
    killed = None
    try:
        watcher.start()
        swarm.start_all()
        wait_until((folder / LAYOUT.experiment_file).exists, 60, "experiment.json", swarm.procs)
        run_id = read_record(folder, LAYOUT.experiment_file, ExperimentRecord).run_id

        def scene_for(round_: int) -> Scene:
            _wait_for_round(swarm, round_, round_mode)
            return Scene(folder, outside, tmp, swarm, run_id, round_, WORKERS, spare, plant_rng)

        planter = Planter(scene_for, cls, result.plant_round, plant_delay)
        planter.start()
        proc = swarm.procs[0] if victim == "coord" else swarm.procs[1 + WORKERS.index(victim)]
        try:
            _kill_at_random(swarm, proc, victim, result.kill_round, kill_rng, round_mode)
            killed = (time.time(), _state_or_none(folder), {w: _rewards(folder, w) for w in WORKERS})
            swarm.start(f"{victim}#2", node=victim)
        except (AssertionError, OSError, ValueError) as exc:  # the swarm broke down before the kill
            result.problems.append(f"no kill in round {result.kill_round}: {str(exc)[:300]}")
        planter.join(timeout=60)
        codes = _wait_all(result, swarm, 120, lambda: _undo_a_reset_after_the_end(result, swarm, run_id, tmp))
    finally:
        if planter is not None:
            planter.halt.set()
        swarm.stop()
        watcher.stop()
    planted = planter.planted or Planted(f"{cls} (not planted: {planter.error or 'the run ended first'})")
    result.planted = planted.what
    if result.reset_after_the_end is not None:
        result.planted += " (it came after the end and reset the finished run: the operator's reset, undone)"
        planted.forged_runs.add(result.reset_after_the_end)  # its new run's states, seen by the watcher
    _judge_exits(result, codes, swarm, planted)
    _judge(result, "files", lambda: _judge_files(result, swarm, watcher, planted, victim, killed, round_mode))
    if killed is not None and not result.unable_to_restart:
        try:
            _check_restart(folder, victim, killed[1], killed[0], "random")
        except (AssertionError, OSError, ValueError) as exc:
            result.unable_to_restart.append(f"{victim}: did not resume where it stopped: {str(exc)[:500]}")
    result.crashes += _reader_sweep(folder, tmp)
    _restart_everyone(result, swarm)
    after_outside = _snapshot(outside)
    result.outside_bytes = sum(len(v) for k, v in after_outside.items() if before_outside.get(k) != v)
    result.outside_bytes += sum(1 for k in before_outside if k not in after_outside)  # deleted through a link
    result.seconds = time.monotonic() - started
    return result


def _judge(result: MixedResult, what: str, check) -> None:
    """Run one judgement; a check that cannot even read what it judges is a problem of the trial, not a crash."""
    try:
        check()
    except Exception as exc:  # noqa: BLE001 - e.g. a planted file where the check expects a record
        result.problems.append(f"checking {what}: {type(exc).__name__}: {str(exc)[:500]}")


def _wait_all(result: MixedResult, swarm: Swarm, timeout: float, before_extras=None) -> dict[str, int]:
    """Exit codes of the processes not killed by the trial; those still running after ``timeout`` are problems.
    The swarm's own nodes are waited for first, then ``before_extras()`` runs, then a planter's processes."""
    deadline = time.monotonic() + timeout
    codes = {}
    extras = [p for p in swarm.procs if p.name in ("twin", "rival")]
    for p in [*(p for p in swarm.procs if p not in extras), None, *extras]:
        if p is None:
            if before_extras is not None:
                before_extras()
            continue
        if p.returncode == -9 or (p.name == "rival" and result.reset_after_the_end is not None):
            continue
        try:
            codes[p.name] = p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except Exception:  # noqa: BLE001 - still running: stopped below, reported here
            result.problems.append(f"{p.name} did not finish within {timeout:g} s: {_last_lines(p)}")
    return codes


def _undo_a_reset_after_the_end(result: MixedResult, swarm: Swarm, run_id: str, tmp: Path) -> None:
    """The rival coordinator is started while the run plays, but reads the state about a second later: a fast async
    run can finish meanwhile, and RESET_EXPERIMENT=true over a finished run is the operator's documented reset
    (GDRIVE_IMPLEMENTATION.md §8; a new run, a new key), which archives it and waits for the workers of its new
    run. Then the rival is stopped and the finished run is put back where the judge reads it: the trial judges the
    swarm's run (seed 33 of the async run of issue 30's classes, trial 8). Called once the swarm's own nodes have
    exited: a rival still watching the coordinator's heartbeat (at most LIVENESS_TIMEOUT) is waited for until it
    either exits or has moved the finished run (seed 42 of that run, trials 20 and 27)."""
    from swarm_gdrive.procs import stop_all

    rival = next((p for p in swarm.procs if p.name == "rival"), None)
    state_file = Path(LAYOUT.state_file).relative_to(LAYOUT.root)

    def archived_finished_run() -> Path | None:
        for archived in sorted((swarm.folder / LAYOUT.archive_root).glob("reset_*")):
            try:
                state = decode((archived / state_file).read_bytes(), StateRecord)
            except (OSError, RecordError):
                continue
            if state.run_id == run_id and state.status == "finished":
                return archived
        return None

    deadline = time.monotonic() + float(swarm.env["LIVENESS_TIMEOUT"]) + 20
    archived = None
    while rival is not None and rival.returncode is None and time.monotonic() < deadline:
        archived = archived_finished_run()
        if archived is not None:
            break
        time.sleep(0.1)
    if archived is None:
        return
    stop_all([rival], timeout=10)
    new_run = tmp / "the-rivals-new-run"
    os.replace(swarm.folder / LAYOUT.root, new_run)
    os.replace(archived, swarm.folder / LAYOUT.root)
    experiment = Path(LAYOUT.experiment_file).relative_to(LAYOUT.root)
    result.reset_after_the_end = decode((new_run / experiment).read_bytes(), ExperimentRecord).run_id


def _wait_for_round(swarm: Swarm, round_: int, round_mode: str = "sync") -> None:
    wait_until(lambda: round_reached(swarm.folder, round_, round_mode), 90, f"round {round_}", swarm.procs)


def _judge_exits(result: MixedResult, codes: dict[str, int], swarm: Swarm, planted: Planted) -> None:
    for name, code in codes.items():
        if name in ("twin", "rival"):
            _judge_extra(result, name, code, planted)
        elif name.endswith("#2"):
            if code != 0:
                result.unable_to_restart.append(f"{name}: exit {code}")
        elif code == 1:
            result.crashes.append(f"{name}: exit 1")
        elif code != 0:
            result.problems.append(f"{name}: exit {code}")
    if result.crashes or result.problems or result.unable_to_restart:
        result.problems.append(swarm.tails(12)[-5000:])


def _judge_extra(result: MixedResult, name: str, code: int, planted: Planted) -> None:
    """A planter's own process: a twin of a worker may exit 0, 2 or 3; a second coordinator beside the live one
    must refuse to start (exit code 2). Exit code 1 is a crash for both."""
    who = f"twin of {planted.twin_of}" if name == "twin" else "rival coordinator"
    if code == 1:
        result.crashes.append(f"{who}: exit 1")
    elif code not in ((0, 2, 3) if name == "twin" else (2,)):
        result.problems.append(f"{who}: exit {code}" + ("" if name == "twin" else ", not 2 (it did not refuse)"))


def _judge_files(
    result: MixedResult, swarm: Swarm, watcher: MixedWatcher, planted: Planted, victim: str, killed, round_mode: str
) -> None:
    folder = swarm.folder
    hostile = planted.paths
    result.problems += watcher.problems(hostile, planted.forged_states, frozenset(planted.forged_runs))
    left = [p for p in leftovers(folder) if not _under(p, hostile)]
    if left:
        result.problems.append(f"temporaries left behind: {left}")
    _judge(result, "the final state", lambda: assert_swarm_finished(folder, ROUNDS, round_mode))
    before = killed[2] if killed is not None else {}
    for w in WORKERS:
        after = _rewards(folder, w)
        result.lost += sum(1 for r, run in before.get(w, {}).items() if after.get(r) != run)
        skipped = skipped_rounds(folder, w) if w == victim and w not in planted.tainted_logs else set()
        missing = [r for r in range(ROUNDS) if r not in skipped and r not in after]
        result.lost += len(missing)
        if missing:  # a worker that exited 0 without them stopped early (a forged "finished", a forged run)
            for proc in swarm.procs:
                if proc.name in (w, f"{w}#2") and proc.returncode == 0:
                    result.early_exits.append(f"{proc.name}: exit 0 without rounds {missing}")
    for node in ["coord", *WORKERS]:
        if node in planted.tainted_logs:
            continue
        try:
            honest = {p: m for p, m in rejections(folder, node, node == victim).items() if not _under(p, hostile)}
            metrics(folder, node, node == victim)
        except AssertionError as exc:
            result.problems.append(f"{node}'s logs: {exc}")
            continue
        if honest:
            result.problems.append(f"{node} rejected honest files: {honest}")


def _state_or_none(folder: Path) -> StateRecord | None:
    try:
        return _state(folder)
    except (OSError, ValueError):  # a planted state (RecordError is a ValueError)
        return None


def _rewards(folder: Path, node: str) -> dict[int, str]:
    """round -> run id of every valid reward file of ``node`` (stage 0); what is not one is not counted."""
    out = {}
    base = folder / LAYOUT.rewards_dir
    for round_dir in base.iterdir() if base.is_dir() else []:
        round_ = parse_round_dir(round_dir.name)
        path = folder / LAYOUT.reward_file(round_, 0, node) if round_ is not None else None
        try:
            out[round_] = decode(path.read_bytes(), RewardRecord).run_id
        except (AttributeError, OSError, RecordError):
            continue
    return out


def _reader_sweep(folder: Path, tmp: Path) -> list[str]:
    """The reading commands' loader and a checkpoint loader on what the trial left: neither may raise."""
    from swarm_gdrive.observe.monitor import findings, load, status_table

    crashes = []
    storage = LocalStorage(folder)
    try:
        snapshot = load(storage, EXPERIMENT)
        findings(snapshot)
        status_table(snapshot)
    except Exception as exc:  # noqa: BLE001 - what the issue calls a crash of status/validate/report
        crashes.append(f"monitor.load/findings/status_table: {type(exc).__name__}: {str(exc)[:300]}")
    checkpoints = folder / LAYOUT.root / "checkpoints"
    if checkpoints.is_dir():
        from swarm_gdrive.names import InvalidNameError, validate_name
        from swarm_gdrive.training.checkpoint import load_latest

        for node in sorted(p.name for p in checkpoints.iterdir()):
            try:
                validate_name(node, "node id")
            except InvalidNameError:
                continue  # no worker can have this NODE_ID (it exits 2), so none loads from this folder
            try:
                load_latest(storage, LAYOUT, node, tmp / "restore" / node)
            except Exception as exc:  # noqa: BLE001 - a restarted grpo worker would die of it
                crashes.append(f"checkpoint.load_latest({node}): {type(exc).__name__}: {str(exc)[:300]}")
    return crashes


def _restart_everyone(result: MixedResult, swarm: Swarm) -> None:
    """Once the run is over, every node started again must come up and exit 0 (the experiment is finished)."""
    again = [swarm.start(f"{name}#final", node=name) for name in ["coord", *WORKERS]]
    try:
        for proc in again:
            try:
                code = proc.wait(timeout=60)
            except Exception:  # noqa: BLE001 - a node that hangs on a restart cannot restart
                code = None
            if code != 0:
                result.unable_to_restart.append(f"{proc.name}: exit {code}: {_last_lines(proc)}")
    finally:
        swarm.stop()


def _last_lines(proc, n: int = 3) -> str:
    return " | ".join(proc.lines[-n:])[-600:]
