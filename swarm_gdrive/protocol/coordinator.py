"""The round clock. :func:`decide` is pure; :class:`Coordinator` wraps it with the I/O.

A round advances when every live worker has submitted its reward for the round's last
stage, or when COORDINATOR_ROUND_INTERVAL seconds (coordinator's own clock) have passed
since it opened. Liveness is judged on the coordinator's clock: a worker is live while
its peer file keeps changing in the listing of ``peers/``. The coordinator never loads a model.

What it costs a remote store per round (GDRIVE_IMPLEMENTATION.md §5.3, §6, §15.5): a listing of the round's rewards
per poll, each reward file downloaded once (several at once), a listing of ``peers/`` at most every
HEARTBEAT_INTERVAL / 4 seconds with a peer file downloaded only when it changed and its record matters,
and the next round's folders created ahead of it. Polls are brisk while some but not all live workers
have submitted, and around the moment the round is expected to end; they back off otherwise.

In an asynchronous experiment (ROUND_MODE=async, the state's ``mode``) there is no round clock: each worker plays
its own rounds. The coordinator opens the experiment as above, writes one ``running`` state, and then keeps only
liveness (``live_workers``, rewritten when the set changes), the record of each worker's progress, the stop, and
the end: :func:`decide_async` finishes the experiment once every live worker that joined has submitted the last
stage of round MAX_ROUNDS - 1, and at least one has.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from swarm_gdrive import logctx
from swarm_gdrive.protocol.exchange import Exchange, RunChangedError, listing_key
from swarm_gdrive.protocol.heartbeat import Heartbeat
from swarm_gdrive.protocol.layout import Layout, parse_round_dir
from swarm_gdrive.protocol.metrics import NodeLog
from swarm_gdrive.protocol.polling import BRISK_FRACTION, Backoff, Pacer, RoundClock, Stopped, wait_for
from swarm_gdrive.protocol.progress import SwarmProgress
from swarm_gdrive.protocol.records import (
    MAX_BYTES,
    ExperimentRecord,
    PeerRecord,
    RecordError,
    StateRecord,
    decode,
    encode,
)
from swarm_gdrive.protocol.settings import ProtocolSettings
from swarm_gdrive.protocol.signing import CoordinatorKey, KeyFileError, key_path, self_signed, short, signed_by
from swarm_gdrive.protocol.tracking import tracking_for
from swarm_gdrive.protocol.trust import CONFIRM_SECONDS
from swarm_gdrive.storage import FileInfo, Storage

logger = logging.getLogger(__name__)

#: Seconds between the coordinator's "waiting for workers" lines while round 0 has not opened, and between an
#: asynchronous experiment's progress lines (INFO, and a metric line when rewards came in).
WAITING_REPORT_SECONDS = 30.0
#: Rounds past the open one whose folders the coordinator has already made.
ROUNDS_AHEAD = 2


class ExperimentMismatchError(RuntimeError):
    """The folder holds an experiment with another configuration; the message says what to do."""


class RivalCoordinatorError(ExperimentMismatchError):
    """Another coordinator (another NODE_ID) runs this experiment: this one refused to start, or it yields to one
    that took over (COORDINATOR_TAKEOVER). Exit code 2, as for a mismatch; the message names the other and the fix."""


class Liveness:
    """Observer-clock liveness: a node is live while its marker changed within ``timeout`` seconds."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._seen: dict[str, tuple[Hashable, float]] = {}

    def observe(self, node_id: str, marker: Hashable, now: float) -> None:
        """Record ``marker`` (anything that changes with each heartbeat) as seen at ``now``."""
        previous = self._seen.get(node_id)
        if previous is None or previous[0] != marker:
            self._seen[node_id] = (marker, now)

    def forget(self, node_id: str) -> None:
        self._seen.pop(node_id, None)

    def quiet(self, now: float, for_s: float) -> frozenset[str]:
        """Nodes whose marker has not changed for ``for_s`` seconds."""
        return frozenset(n for n, (_, changed) in self._seen.items() if now - changed >= for_s)

    def live(self, now: float) -> frozenset[str]:
        return frozenset(n for n, (_, changed) in self._seen.items() if now - changed < self.timeout)


@dataclass
class _LateWatch:
    """A round closed on the deadline: the live workers whose reward had not arrived, watched a while longer."""

    stage: int
    missing: set[str]
    closed_at: float  # coordinator's clock
    arrived: int = 0


@dataclass(frozen=True)
class Decision:
    """What the coordinator does next: ``state`` to write (None: nothing), and why."""

    state: StateRecord | None
    reason: str
    restart_timer: bool = False


def _not_running(
    state: StateRecord, live: frozenset[str], interval: float, min_workers: int, now: float, past_deadline: bool
) -> Decision:
    """Either mode's decision on a ``finished`` state (nothing) or a ``waiting`` one (round 0 opens, ``running``,
    once MIN_WORKERS are live; ``finished`` once past EXPERIMENT_DEADLINE_MINUTES)."""
    if state.status == "waiting" and past_deadline:
        return Decision(_open(state, state.round, "finished", live, interval, now, "deadline"), "deadline", True)
    if state.status == "waiting" and len(live) >= min_workers:
        return Decision(_open(state, state.round, "running", live, interval, now, "start"), "start", True)
    return Decision(None, "finished" if state.status == "finished" else "waiting for workers")


def decide(
    state: StateRecord,
    live: frozenset[str],
    submitted: frozenset[str],
    elapsed: float,
    interval: float,
    min_workers: int,
    now: float,
    past_deadline: bool = False,
) -> Decision:
    """The next state from the current one; pure.

    ``elapsed`` is how long the round has been open on the coordinator's clock; ``now`` is
    wall time, only written into the record. A round with no live worker does not time out:
    its timer restarts, so rounds are not burnt while nobody is there. ``past_deadline``
    (EXPERIMENT_DEADLINE_MINUTES has passed): the round ends as it would have, and the
    experiment finishes there (``advance_reason: deadline``) instead of opening the next one;
    a round held for want of a live worker finishes at once, unplayed.
    """
    if state.status in ("finished", "waiting"):
        return _not_running(state, live, interval, min_workers, now, past_deadline)
    all_submitted = bool(live) and live <= submitted
    if all_submitted or (elapsed >= interval and (live or submitted)):
        reason = "all_submitted" if all_submitted else "interval"
        if state.round + 1 >= state.max_rounds:
            # round + 1, not max_rounds: never backwards when MAX_ROUNDS was lowered on a resume
            return Decision(_open(state, state.round + 1, "finished", live, interval, now, "finished"), reason, True)
        if past_deadline:
            finished = _open(state, state.round + 1, "finished", live, interval, now, "deadline")
            return Decision(finished, "deadline", True)
        return Decision(_open(state, state.round + 1, "running", live, interval, now, reason), reason, True)
    if elapsed >= interval and past_deadline:
        return Decision(_open(state, state.round, "finished", live, interval, now, "deadline"), "deadline", True)
    if elapsed >= interval:
        return Decision(None, "no live worker: holding the round", True)
    if sorted(live) != state.live_workers:
        return Decision(
            state.model_copy(update={"live_workers": sorted(live), "seq": state.seq + 1, "updated_at": now}),
            "live workers changed",
        )
    return Decision(None, "waiting for submissions")


def decide_async(
    state: StateRecord,
    live: frozenset[str],
    joined: frozenset[str],
    done: frozenset[str],
    interval: float,
    min_workers: int,
    now: float,
    stalled: frozenset[str] = frozenset(),
    past_deadline: bool = False,
    settling: frozenset[str] = frozenset(),
) -> Decision:
    """The next state of an asynchronous experiment (ROUND_MODE=async); pure. No round is ever advanced.

    ``joined``: the workers that registered in this run; ``done``: those with a reward of the last stage of round
    ``max_rounds - 1`` (their last round); ``stalled``: live workers whose round has not changed for
    COORDINATOR_WAIT_TIMEOUT. ``waiting`` opens (``running``, same round) once MIN_WORKERS are live, as
    :func:`decide` does. ``running`` finishes (round ``max_rounds``, never backwards) once at least one worker is
    done and no live worker that joined is still playing: one that stopped, fell silent or stalled does not hold
    the end (as a synchronous round closes without it), so one that died for good or hangs cannot keep the
    experiment open. Past EXPERIMENT_DEADLINE_MINUTES (``past_deadline``) it finishes at once, ``round`` unchanged
    (``advance_reason: deadline``): each worker ends after the round it plays. ``settling``: workers that left the
    live ones less than SYNC_LAG seconds ago; they hold the end like live ones, since on a lagging folder a worker's
    last reward may arrive after the peer file it wrote later (``stopped``). Otherwise only a change of the live
    workers is written.
    """
    if state.status in ("finished", "waiting"):
        return _not_running(state, live, interval, min_workers, now, past_deadline)
    if past_deadline:
        return Decision(_open(state, state.round, "finished", live, interval, now, "deadline"), "deadline", True)
    playing = (joined & (live | settling)) - done - stalled
    if done and not playing:
        last = max(state.round, state.max_rounds)
        return Decision(_open(state, last, "finished", live, interval, now, "finished"), "all_done", True)
    if sorted(live) != state.live_workers:
        return Decision(
            state.model_copy(update={"live_workers": sorted(live), "seq": state.seq + 1, "updated_at": now}),
            "live workers changed",
        )
    return Decision(None, "workers playing")


def _writer_key(state: StateRecord) -> tuple:
    """What tells one write of a state from another."""
    return (state.run_id, state.round, state.seq, state.status, state.coordinator_id)


def _open(
    state: StateRecord, round_: int, status: str, live: frozenset[str], interval: float, now: float, reason: str
) -> StateRecord:
    return state.model_copy(
        update={
            "round": round_,
            "status": status,
            "seq": state.seq + 1,
            "round_opened_at": now,
            "round_deadline": now + interval,
            "live_workers": sorted(live),
            "advance_reason": reason,
            "updated_at": now,
        }
    )


class Coordinator:
    """Runs the round clock of one experiment until it finishes or the node is stopped."""

    def __init__(
        self,
        config: ProtocolSettings,
        storage: Storage,
        node_id: str,
        stop: threading.Event,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.layout = Layout(config.experiment_name)
        self.exchange = Exchange(storage, self.layout, node_id)
        self.node_id = node_id
        self.stop = stop
        self.clock = clock
        #: This process, in every state it writes: its own writes are told from any other's, even its NODE_ID's.
        self.instance = secrets.token_hex(8)
        self._experiment: ExperimentRecord | None = None  # experiment.json as this process wrote or resumed it
        self._created_here = False  # this process created the run (not resumed it)
        #: Its Ed25519 key (protocol/signing.py); None while it runs an experiment created before keys existed.
        self.key: CoordinatorKey | None = None
        self.key_path = key_path(config.local_dir, config.experiment_name, config.coordinator_key_file)
        self._taken_over: str | None = None  # the coordinator this one took over from (COORDINATOR_TAKEOVER)
        self._frozen: set[tuple[str, float, int]] = set()  # peer files of other coordinators seen not beating
        self._restored = False  # it wrote its state or experiment.json back at least once: someone writes there
        self.liveness = Liveness(config.liveness_timeout)
        self.workers_seen: set[str] = set()
        # workers whose last record read says alive (liveness by listing), with when that entry was first read
        self._alive: dict[str, tuple[PeerRecord, float]] = {}
        self._rounds: dict[str, int | None] = {}  # each worker's round in its last record read (stopped ones too)
        self._round_since: dict[str, tuple[int | None, float]] = {}  # that round, and since when (own clock)
        self._stalled: frozenset[str] = frozenset()
        self._created_at: float | None = None  # experiment.json's: EXPERIMENT_DEADLINE_MINUTES counts from it
        self.progress = SwarmProgress(config.max_rounds)
        self._peer_listing: dict[str, FileInfo] = {}
        self._live: frozenset[str] = frozenset()
        self._peers_listed_at = -math.inf
        self.rounds = RoundClock()
        self.late: dict[int, _LateWatch] = {}  # rounds closed on the deadline whose late rewards are still counted
        self._waiting_said: tuple[frozenset[str], frozenset[str], float] | None = None
        self.log = NodeLog(storage, self.layout, node_id)
        self.tracking = tracking_for(config, node_id)
        self.log.sinks.append(self.tracking.log)
        self.exchange._on_reject = lambda path, reason: self.log.event(
            "file_rejected", f"{path}: {reason}", level="warning", path=path
        )

    # -- start -----------------------------------------------------------------------------

    def open_experiment(self) -> StateRecord:
        """Create the experiment, or resume it; refuse one with another configuration, or one that another
        coordinator still runs (:meth:`_refuse_live_rival`; before anything is written, a reset included)."""
        self._refuse_live_rival()
        self._remove_own_temporaries()
        existing = self.exchange.read_experiment()
        state_exists = bool(self.exchange.entries(self.layout.state_dir))
        if existing is None and state_exists:
            why = self.exchange.rejection(self.layout.experiment_file)
            self._reset_or_refuse(
                f"its experiment.json is invalid ({why})" if why else "its experiment.json is missing"
            )
            return self._create()
        if existing is not None and (existing.public_key is not None or self._kept_path().exists()):
            # before its fields are believed: they may be forged, its key left out too
            existing = self._own_experiment(existing)
            if existing is None:
                return self._create()
        if existing is not None and existing.fingerprint != self.config.fingerprint():
            changed = [
                f"{k.upper()}={then!r} (now {now!r})" for k, now, then in self.config.differing_fields(existing.config)
            ]
            self._reset_or_refuse("it was started with " + ", ".join(changed))
            return self._create()
        if existing is None:
            return self._create()
        if existing.mode != self.config.resolved_round_mode(existing.mode):
            # The mode defines how the rounds were played: a record of both in one run would be neither's.
            self._reset_or_refuse(f"it was started with ROUND_MODE={existing.mode!r} (now {self.config.round_mode!r})")
            return self._create()
        self._play_mode(existing.mode, "the experiment's mode")
        self.exchange.run_id = existing.run_id
        self._experiment = existing
        self._created_at = existing.created_at
        if self.key is not None:
            self.exchange.write_experiment(existing)  # the kept copy, when a participant had replaced it
        return self._resume(existing)

    def _resume(self, existing: ExperimentRecord) -> StateRecord:
        """The state to resume ``existing`` from (the state file's, when this run's and within bounds), written."""
        try:
            state = self.exchange.read_state()
            foreign = None
        except RunChangedError as exc:
            # experiment.json defines the run. A state of another run is a planted file, or what a coordinator
            # killed between writing experiment.json and the first state of a new run left: recovered from, as an
            # unreadable one is, never a reason to stop the swarm.
            state, foreign = None, f"of another run ({exc})"
        last = self._last_rewarded_round(self.config.num_stages)  # once: the bounds check and the recovery use it
        if state is not None and state.mode != existing.mode:  # not this run's: planted, recovered from
            state, foreign = None, f"of ROUND_MODE={state.mode!r}, not experiment.json's {existing.mode!r}"
        if state is not None and self.key is not None and not signed_by(state, self.key.public):
            state, foreign = None, f"not signed by this coordinator's key {short(self.key.public)}"
        if state is not None:
            foreign = self._beyond_bounds(state, last)
            if foreign is not None:
                state = None
        if state is None:
            state = self._recover_state(existing.run_id, last, foreign)
        elif state.status == "finished" and state.round < self.config.max_rounds and not self.past_deadline():
            logger.info("extending finished experiment from %d to %d rounds", state.round, self.config.max_rounds)
            state = state.model_copy(update={"status": "running", "round": state.round})
        elif state.status == "stopped":  # its stop button: the round resumes; round 0 unplayed waits for workers
            status = "waiting" if state.round == 0 and last is None else "running"
            logger.info("resuming the experiment stopped at round %d (%s)", state.round, status)
            state = state.model_copy(update={"status": status})
        state = state.model_copy(
            update={
                "seq": state.seq + 1,
                "max_rounds": self.config.max_rounds,
                "updated_at": time.time(),
                "round_opened_at": time.time(),
                "round_deadline": time.time() + self.config.coordinator_round_interval,
                "coordinator_id": self.node_id,
                "instance": self.instance,
                "advance_reason": "resume" if state.status == "running" else state.advance_reason,
            }
        )
        state = self.exchange.write_state(state)
        self.log.event(
            "coordinator_resumed",
            f"resuming at round {state.round} ({state.status})",
            round_=state.round,
            status=state.status,
        )
        return state

    def _remove_own_temporaries(self) -> None:
        """Temporaries a killed coordinator process left beside the files it owns."""
        own = [
            self.layout.experiment_file,
            self.layout.state_file,
            self.layout.peer_file(self.node_id),
            self.layout.metrics_file(self.node_id),
            self.layout.events_file(self.node_id),
        ]
        removed = self.exchange.remove_own_temporaries(own)
        if removed:
            logger.info("removed %d temporary files left by an earlier coordinator process", removed)

    def _own_experiment(self, existing: ExperimentRecord) -> ExperimentRecord | None:
        """An experiment.json that names a coordinator key: the experiment this coordinator resumes, with its key
        loaded and signing (:attr:`key`); None once RESET_EXPERIMENT moved it to archives/ (then :meth:`_create`).

        Its key must be this coordinator's (COORDINATOR_KEY_FILE, or the default under SWARM_LOCAL_DIR). One that
        this key did not sign (a forgery in place, a run of another key) is replaced by the copy this coordinator
        kept of the last one it signed, when there is one; otherwise it refuses, naming the fix."""
        try:
            key = CoordinatorKey.load(self.key_path)
        except KeyFileError as exc:
            self._reset_or_refuse(str(exc))
            return None
        ours = key is not None and existing.public_key == key.public
        if key is None or not (ours and self_signed(existing)):
            kept = self._kept_experiment(key)
            if kept is None or (not ours and self_signed(existing)):  # none kept, or a run another key signed
                self._refuse_key(existing, key)
                return None
            logger.warning(  # forged in place: this key did not sign it
                "experiment.json (run %s, key %s) is not the one this coordinator signed last: writing run %s back",
                existing.run_id,
                short(existing.public_key),
                kept.run_id,
            )
            existing = kept
        assert key is not None
        self._use_key(key, existing)
        return existing

    def _refuse_key(self, existing: ExperimentRecord, key: CoordinatorKey | None) -> None:
        """Reset (RESET_EXPERIMENT) or refuse an experiment whose key is not in this coordinator's key file."""
        if key is None:
            self._reset_or_refuse(
                f"its experiment.json names coordinator key {short(existing.public_key)}, but this coordinator has no "
                f"key file at {self.key_path}: restore that file there (or point COORDINATOR_KEY_FILE at it; the "
                "notebooks keep it in your own Drive)"
            )
            return
        signed = "signed by it" if self_signed(existing) else "not signed by it"
        self._reset_or_refuse(
            f"its experiment.json names coordinator key {short(existing.public_key)} ({signed}), but this "
            f"coordinator's key file {self.key_path} holds key {short(key.public)}: point COORDINATOR_KEY_FILE at the "
            "experiment's key file"
        )

    def _kept_path(self) -> Path:
        """The copy of the last experiment.json this coordinator signed, beside its key file."""
        return self.key_path.with_name(f"{self.config.experiment_name}.signed-experiment.json")

    def _kept_experiment(self, key: CoordinatorKey | None) -> ExperimentRecord | None:
        """That copy, when it is one ``key`` signed; None otherwise."""
        if key is None:
            return None
        try:
            kept = decode(self._kept_path().read_bytes(), ExperimentRecord)
        except (OSError, RecordError):
            return None
        ok = kept.public_key == key.public and self_signed(kept) and kept.experiment == self.config.experiment_name
        return kept if ok else None

    def _use_key(self, key: CoordinatorKey, experiment: ExperimentRecord) -> None:
        """Sign every experiment.json and state from here on with ``key``; keep a copy of ``experiment`` (signed)
        beside the key, from which a restart puts it back if a participant replaced it meanwhile."""
        self.key = key
        self.exchange.signer = key.sign
        signed = key.sign(experiment)
        kept = self._kept_path()
        tmp = kept.with_name(f".{kept.name}.tmp")
        try:
            tmp.write_bytes(encode(signed))
            os.replace(tmp, kept)
        except OSError as exc:  # the copy only helps a restart during a forgery: the run goes on without it
            logger.warning("could not keep a copy of experiment.json in %s: %s", kept, exc)
        logger.info("signing experiment.json and every state with coordinator key %s (%s)", short(key.public), key.path)

    def _reset_or_refuse(self, why: str) -> None:
        if not self.config.reset_experiment:
            raise ExperimentMismatchError(
                f"EXPERIMENT_NAME={self.config.experiment_name!r}: the folder {self.layout.root} already holds an "
                f"experiment, and {why}: use another EXPERIMENT_NAME, restore those values, or set "
                "RESET_EXPERIMENT=true to move it to archives/ and start afresh (a new run; with a new coordinator "
                "key, its workers rejoin only once started with REPIN_COORDINATOR_KEY=true)"
            )
        self._refuse_reset_under_a_recent_coordinator()
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        target = self.layout.reset_archive_dir(stamp)
        logger.warning("RESET_EXPERIMENT: moving %s to %s", self.layout.root, target)
        self.exchange.storage.move(self.layout.root, target)

    def _refuse_reset_under_a_recent_coordinator(self) -> None:
        """RESET_EXPERIMENT over a run another coordinator was playing (``waiting`` or ``running``): its heartbeat is
        watched for LIVENESS_TIMEOUT first, not the short window of :meth:`_refuse_live_rival`, so that a coordinator
        killed a moment ago and restarting is not reset under its workers (RivalCoordinatorError, exit code 2, when
        it beats). A finished or stopped run, or one whose coordinator left no live peer file, resets at once."""
        found = self.exchange.read_state_file()
        if found is None or found.status not in ("waiting", "running") or found.coordinator_id == self.node_id:
            return
        other = found.coordinator_id
        if other == self._taken_over or self._coordinator_peer(other) is None:
            return
        window = self.config.liveness_timeout
        logger.warning(
            "RESET_EXPERIMENT: coordinator %r was playing round %d: watching its heartbeat %g s (LIVENESS_TIMEOUT) "
            "before resetting its experiment",
            other,
            found.round,
            window,
        )
        beat = self._watch_rival(other, window=window)
        if beat is not None:
            raise RivalCoordinatorError(
                f"EXPERIMENT_NAME={self.config.experiment_name!r}: RESET_EXPERIMENT refused: coordinator {other!r} "
                f"runs this experiment ({beat}). Stop it first (a coordinator whose heartbeat stopped for "
                f"LIVENESS_TIMEOUT={window:g} s is gone), or set COORDINATOR_TAKEOVER=true"
            )

    def _play_mode(self, mode: str, why: str) -> None:
        """From here on ``config.round_mode`` is the mode this run plays (ROUND_MODE=auto resolved, ``why`` says
        how)."""
        if self.config.round_mode == "auto":
            logger.info("ROUND_MODE=auto: %s rounds (%s)", mode, why)
        self.config = replace(self.config, round_mode=mode)

    def _create(self) -> StateRecord:
        self._play_mode(self.config.resolved_round_mode(), f"SYNC_LAG={self.config.sync_lag:g}")
        run_id = secrets.token_hex(8)
        self.exchange.run_id = run_id
        self.exchange.prepare_experiment()  # before experiment.json, which workers wait for
        self._created_at = time.time()
        try:
            key = CoordinatorKey.load_or_create(self.key_path)
        except KeyFileError as exc:
            raise ExperimentMismatchError(f"{exc}: set COORDINATOR_KEY_FILE to a writable file") from None
        self._experiment = ExperimentRecord(
            experiment=self.config.experiment_name,
            run_id=run_id,
            fingerprint=self.config.fingerprint(),
            config=self.config.fingerprint_fields(),
            coordinator_id=self.node_id,
            created_at=self._created_at,
            mode=self.config.round_mode,
            public_key=key.public,
        )
        self._experiment = key.sign(self._experiment)
        self._created_here = True
        self._use_key(key, self._experiment)
        self.exchange.write_experiment(self._experiment)
        state = self._initial_state(run_id)
        state = self.exchange.write_state(state)
        self.log.event("experiment_created", f"run {run_id}", round_=0, fingerprint=self.config.fingerprint())
        return state

    def _beyond_bounds(self, state: StateRecord, last: int | None) -> str | None:
        """Why a state of this run cannot be the one this coordinator left (None: it can). Its round is at most
        MAX_ROUNDS and one past ``last``, the newest round with rewards (rounds open only once the previous one is
        rewarded or closed on its deadline): a planted round 999 seen at a restart is not resumed from."""
        if state.round > self.config.max_rounds:
            return f"round {state.round}, beyond MAX_ROUNDS={self.config.max_rounds}"
        if state.round > (0 if last is None else last + 1):
            return f"round {state.round}, more than one past the last round with rewards ({last})"
        return None

    def _recover_state(self, run_id: str, last: int | None, why: str | None = None) -> StateRecord:
        """The state to resume from when the state file is absent or unreadable (a hostile or broken file).

        Without rewards, round 0 waits for workers as on a first start. Otherwise the round after the last one
        with a valid reward, below MAX_ROUNDS, opens (finished past the last round): a worker still in that
        round finishes and submits it, and nobody waits for a round that has already been played. ``last``: that
        round (:meth:`_last_rewarded_round`), None when no round has rewards.
        """
        state = self._initial_state(run_id)
        if last is None:
            if why is not None:
                self.log.event(
                    "state_recovered",
                    f"{self.layout.state_file} is {why}: starting at round 0, no round has rewards",
                    level="warning",
                    round_=0,
                    status=state.status,
                )
            return state
        why = why or self.exchange.rejection(self.layout.state_file) or "missing"
        if state.mode == "async":  # no round to resume: the workers' own progress is in their rewards
            self.log.event(
                "state_recovered",
                f"{self.layout.state_file} is {why}: resuming the asynchronous experiment (rewards up to round {last})",
                level="warning",
                round_=0,
                status="running",
            )
            return state.model_copy(update={"status": "running", "advance_reason": "resume"})
        round_ = last + 1
        status = "finished" if round_ >= self.config.max_rounds else "running"
        self.log.event(
            "state_recovered",
            f"{self.layout.state_file} is {why}: resuming at round {round_} ({status}), after round {last}, the last "
            "with rewards",
            level="warning",
            round_=round_,
            status=status,
        )
        return state.model_copy(update={"round": round_, "status": status, "advance_reason": "resume"})

    def _last_rewarded_round(self, stages: int) -> int | None:
        """The newest round below MAX_ROUNDS with a valid reward of this run, from the rewards folders."""
        exchange = self.exchange
        rounds = sorted(
            (r for _, r in exchange.numbered_folders(self.layout.rewards_dir, parse_round_dir)), reverse=True
        )
        for round_ in rounds:
            if round_ < self.config.max_rounds and any(exchange.read_rewards(round_, s) for s in range(stages)):
                return round_
        return None

    def _initial_state(self, run_id: str) -> StateRecord:
        now = time.time()
        return StateRecord(
            experiment=self.config.experiment_name,
            run_id=run_id,
            round=0,
            status="waiting",
            seq=0,
            max_rounds=self.config.max_rounds,
            num_stages=self.config.num_stages,
            round_opened_at=now,
            round_deadline=now + self.config.coordinator_round_interval,
            coordinator_id=self.node_id,
            updated_at=now,
            mode=self.config.round_mode,
            instance=self.instance,
        )

    # -- loop ------------------------------------------------------------------------------

    def observe(self, now: float, every: bool = True) -> frozenset[str]:
        """List the peers folder and return the live workers.

        A worker is live while its peer file's listing entry (size, mtime, version) keeps changing. A peer file is
        downloaded only when it changed since its last read and its record matters: a node not known as an alive
        worker (new, or stopped and maybe back), or an alive one whose file has then stayed unchanged for a
        heartbeat: a worker that beats on is alive, one that fell silent may have written 'stopped' (or its
        file was replaced by something else). ``every``: every changed file is read (while round 0 waits).
        """
        listing = self.exchange.peer_files()
        listing_before = self._peer_listing
        for node_id, info in listing.items():
            self.liveness.observe(node_id, listing_key(info), now)
        # A beating worker's file changes every HEARTBEAT_INTERVAL (plus its write and this listing's spacing):
        # one unchanged for two intervals has stopped beating; one not read for LIVENESS_TIMEOUT / 2 is read anyway.
        quiet = self.liveness.quiet(now, 2 * self.config.heartbeat_interval)
        stale = {n for n, (_, read_at) in self._alive.items() if now - read_at >= self.config.liveness_timeout / 2}
        needed = {
            node_id: info
            for node_id, info in listing.items()
            if node_id != self.node_id  # its own file, which its heartbeat keeps: never a worker
            and (every or node_id not in self._alive or node_id in quiet or node_id in stale)
        }
        for node_id, seen in self.exchange.read_peer_files(needed).items():
            record = seen.record
            if isinstance(record, PeerRecord) and record.role == "worker":
                self.workers_seen.add(node_id)
                self._rounds[node_id] = record.round
            if not isinstance(record, PeerRecord) or record.role != "worker" or record.status == "stopped":
                self._alive.pop(node_id, None)
                self.liveness.forget(node_id)
                continue
            if node_id not in self._alive or seen.info != listing_before.get(node_id):
                self._alive[node_id] = (record, now)
        self._peer_listing = listing
        return self.liveness.live(now) & frozenset(self._alive)

    def _observe_peers(self, state: StateRecord, now: float) -> frozenset[str]:
        """The live workers: the peers folder is listed at most every HEARTBEAT_INTERVAL / 4 seconds while a round
        runs (heartbeats change it no faster), at every poll while round 0 waits for workers."""
        running = state.status == "running"
        if running and now - self._peers_listed_at < self.config.heartbeat_interval / 4:
            return self._live
        self._peers_listed_at = now
        self._live = self.observe(now, every=not running)
        return self._live

    def submissions(self, state: StateRecord) -> frozenset[str]:
        """Workers that submitted the round's last stage. Only registered workers count: a stray
        reward file cannot close a round."""
        if state.status != "running":
            return frozenset()
        return frozenset(self.exchange.read_rewards(state.round, state.num_stages - 1, only=self.workers_seen))

    def run(self) -> int:
        """Serve rounds until finished (0) or stopped (0). Raises :class:`RivalCoordinatorError` (exit code 2) when
        another coordinator runs the experiment, at the start or once it took over."""
        try:
            state = self.open_experiment()
        except Stopped:  # while it watched another coordinator's heartbeat: nothing written yet
            logger.info("stopping on request")
            return 0
        if state.status == "finished":
            logger.info("experiment %s already finished after %d rounds", self.config.experiment_name, state.round)
            self.log.flush()  # its coordinator_resumed event, and what a restart after the end found
            return 0
        heartbeat = Heartbeat(self.exchange, "coordinator", state.run_id, self.config.heartbeat_interval)
        heartbeat.start()
        self.tracking.start(state.run_id)
        try:
            serve = self._serve_async if state.mode == "async" else self._serve
            state = serve(state, heartbeat)
            self._drain()
            self._hold_finished(state)
        except Stopped:
            logger.info("stopping on request")
        finally:
            heartbeat.stop()
            self.log.flush()
            self.tracking.close()
            self.exchange.close()
        return 0

    def _pass_start(self, state: StateRecord, checked: float) -> tuple[StateRecord, float, float]:
        """The start of a pass of either loop: stopped, write ``stopped`` and raise :class:`Stopped`; else read back
        its own state when HEARTBEAT_INTERVAL has passed since ``checked``. Returns (state, checked, now)."""
        if self.stop.is_set():
            self._announce_stop(state)
            raise Stopped()
        now = self.clock()
        if now - checked >= self.config.heartbeat_interval:
            state, checked = self._keep_own_state(state), self.clock()
        return state, checked, now

    def _serve(self, state: StateRecord, heartbeat: Heartbeat) -> StateRecord:
        """The loop of a synchronous experiment (:func:`decide`); returns the ``finished`` state it wrote."""
        brisk = self.config.poll_interval_min * BRISK_FRACTION
        pacer = Pacer(Backoff(self.config.poll_interval_min, self.config.poll_interval_max), brisk, self.clock)
        opened = checked = self.clock()
        last_seen: tuple[frozenset[str], frozenset[str]] | None = None
        self.prepare_rounds(state)
        while state.status != "finished":
            state, checked, now = self._pass_start(state, checked)
            submitted = self.submissions(state)
            live = self._observe_peers(state, now)
            self.watch_late(now, self.config.coordinator_round_interval + self.config.sync_lag)
            if state.status == "waiting" and len(live) < self.config.min_workers:
                self.report_waiting(live, now)
            decision = decide(
                state,
                live,
                submitted,
                now - opened,
                self.config.coordinator_round_interval,
                self.config.min_workers,
                time.time(),
                self.past_deadline(),
            )
            if decision.restart_timer:
                opened = now
            if decision.state is not None and not self._holds(state):
                state, checked = self._keep_own_state(state), self.clock()  # a rival's: yield; else restored
                continue
            if decision.state is not None:
                published = self._publish(state, decision, live, submitted, now)
                new_round = published.round != state.round or published.status != state.status
                state = published
                logctx.set_round(state.round)
                heartbeat.set_round(state.round)
                pacer.reset()
                if new_round and state.status == "running":
                    self.rounds.opened(state.round, self.clock())
                    pacer.expect(*(self.rounds.next_open() or (None, 0.0)))
                    self.prepare_rounds(state)
            if (live, submitted) != last_seen:
                # Submissions come in a burst at the end of a round: once half the live workers' are in, the rest
                # are near (before that, brisk polls would mostly list the same few files again).
                burst = state.status == "running" and live - submitted and 2 * len(live & submitted) >= len(live)
                pacer.reset(brisk if burst else None)
                last_seen = (live, submitted)
            if state.status != "finished":
                timeout = pacer.next()
                if state.status == "running":
                    timeout = min(timeout, max(0.0, self.config.coordinator_round_interval - (self.clock() - opened)))
                self.stop.wait(max(timeout, 0.01))
        return state

    def _hold_finished(self, state: StateRecord) -> None:
        """After the end of a run in which this coordinator had to write its state or experiment.json back (a
        participant writes there), before exiting: the workers live at the finish may not have read ``finished``
        yet, and a state written over it (which they ignore) would leave them waiting for it until
        COORDINATOR_WAIT_TIMEOUT. Until each has stopped or fallen silent (§6), for at most
        COORDINATOR_ROUND_INTERVAL + SYNC_LAG, this coordinator reads its state back every HEARTBEAT_INTERVAL and
        writes it again if it is not there (:meth:`_keep_own_state`)."""
        if not self._restored:
            return
        waiting = self.observe(self.clock())
        started = checked = self.clock()
        window = self.config.coordinator_round_interval + self.config.sync_lag
        backoff = Backoff(self.config.poll_interval_min, self.config.poll_interval_max)
        while waiting and self.clock() - started < window:
            if self.stop.wait(max(backoff.next(), 0.01)):
                return
            now = self.clock()
            if now - checked >= self.config.heartbeat_interval:
                state, checked = self._keep_own_state(state), self.clock()
            waiting &= self.observe(now)

    def past_deadline(self) -> bool:
        """EXPERIMENT_DEADLINE_MINUTES (0: none) has passed since experiment.json's ``created_at``, on this node's
        wall clock."""
        minutes = self.config.experiment_deadline_minutes
        return bool(minutes) and self._created_at is not None and time.time() >= self._created_at + 60 * minutes

    def deadline_message(self) -> str:
        return f"EXPERIMENT_DEADLINE_MINUTES={self.config.experiment_deadline_minutes:g} has passed"

    def _serve_async(self, state: StateRecord, heartbeat: Heartbeat) -> StateRecord:
        """The loop of an asynchronous experiment: liveness, each worker's progress, the end (:func:`decide_async`);
        no round is opened and no worker waits for this node. Stopped, it writes ``stopped`` as the synchronous loop
        does. Finished, it keeps counting the rewards of the workers still live (:meth:`_drain_async`)."""
        backoff = Backoff(self.config.poll_interval_min, self.config.poll_interval_max)
        checked = self.clock()
        seen: tuple[frozenset[str], int] | None = None
        said = -math.inf
        live: frozenset[str] = frozenset()
        left: dict[str, float] = {}  # worker -> when (monotonic) it left the live ones, not done
        previous: frozenset[str] = frozenset()
        while state.status != "finished":
            state, checked, now = self._pass_start(state, checked)
            live = self._observe_peers(state, now)
            if state.status == "waiting" and len(live) < self.config.min_workers:
                self.report_waiting(live, now)
            left = {w: t for w, t in left.items() if w not in live} | {w: now for w in previous - live - left.keys()}
            previous = live
            settling = frozenset(w for w, t in left.items() if now - t < self.config.sync_lag)
            if state.status == "running":
                self.count_progress(state, live | settling)
            decision = self._decide_async(state, live, now, settling)
            if decision.state is not None and decision.state.status == "finished" and decision.reason == "all_done":
                self.count_progress(state, live, state.max_rounds - 1)  # whoever else is done by now is counted so
                decision = self._decide_async(state, live, now, settling)
            if decision.state is not None:
                state = self._write_async(state, decision, live, heartbeat)
            if state.status == "running":
                if now - said >= WAITING_REPORT_SECONDS:
                    said = now
                    logger.info("%s", self.progress_message(state, live))
                    self.progress_line(state, live)
                    self.prune_async(live)
                self._prepare_async_rounds(state)
            if (live, len(self.progress.done)) != seen:
                backoff.reset()
                seen = (live, len(self.progress.done))
            if state.status != "finished":
                self.stop.wait(max(backoff.next(), 0.01))
        self._drain_async(state, live)
        return state

    def _write_async(
        self, state: StateRecord, decision: Decision, live: frozenset[str], heartbeat: Heartbeat
    ) -> StateRecord:
        """Write the decided state of an asynchronous experiment; returns the state in force. If the file no longer
        holds ``state`` (:meth:`_holds`), nothing new is written: :meth:`_keep_own_state` yields to a rival or
        restores ``state``, and the next pass decides again."""
        new = decision.state
        assert new is not None
        if not self._holds(state):
            return self._keep_own_state(state)
        if new.status == "running" and state.status == "waiting":
            self._prepare_async_rounds(new, listed=False)  # before any worker writes into them
        new = self.exchange.write_state(new)
        if new.status != state.status:
            self._async_status_changed(new, live, decision.reason)
        logctx.set_round(new.round)
        heartbeat.set_round(new.round)
        return new

    def _decide_async(
        self, state: StateRecord, live: frozenset[str], now: float, settling: frozenset[str] = frozenset()
    ) -> Decision:
        return decide_async(
            state,
            live,
            frozenset(self.workers_seen),
            frozenset(self.progress.done),
            self.config.coordinator_round_interval,
            self.config.min_workers,
            time.time(),
            self.stalled_workers(live, now) if state.status == "running" else frozenset(),  # not while waiting
            self.past_deadline(),
            settling,
        )

    def count_progress(self, state: StateRecord, live: frozenset[str], round_: int | None = None) -> None:
        """One listing of the rewards of the last stage of ``round_`` (default: :meth:`SwarmProgress.target`'s, for
        the ``live`` workers and the others) and the reads of the files new there, validated as the synchronous
        mode's (run, names, schema, size caps; registered workers only): counted into the progress, a
        ``worker_completed`` event for each worker done."""
        if round_ is None:
            round_ = self.progress.target(frozenset(self.workers_seen), self._rounds, live)
            if round_ is None:
                return
        found = self.exchange.read_rewards(round_, state.num_stages - 1, only=self.workers_seen)
        for node in self.progress.add(round_, found):
            self.log.event(
                "worker_completed",
                f"{node} played its last round, {round_} (MAX_ROUNDS={state.max_rounds})",
                round_=round_,
                node=node,
            )
            self.log.flush()

    def stalled_workers(self, live: frozenset[str], now: float) -> frozenset[str]:
        """The live workers whose round (peer record) has not changed for COORDINATOR_WAIT_TIMEOUT on this node's
        clock: alive but not progressing (a hung generate); a ``worker_stalled`` warning names each as it stalls,
        ``worker_progressing`` when it moves again."""
        # A beating worker's record is read again at least every LIVENESS_TIMEOUT / 2 (observe): no shorter timeout
        timeout = max(self.config.coordinator_wait_timeout, self.config.liveness_timeout)
        for node in set(self._round_since) - live:  # one that left and comes back is timed afresh
            del self._round_since[node]
        for node in live:
            round_ = self._rounds.get(node)
            if self._round_since.get(node, (None, 0.0))[0] != round_ or node not in self._round_since:
                self._round_since[node] = (round_, now)
        stalled = frozenset(n for n in live if now - self._round_since[n][1] >= timeout and n not in self.progress.done)
        for node in sorted(stalled - self._stalled):
            self.log.event(
                "worker_stalled",
                f"{node} is alive but has stayed at round {self._rounds.get(node)} for {timeout:g} s "
                "(COORDINATOR_WAIT_TIMEOUT, at least LIVENESS_TIMEOUT): it no longer holds the end of the experiment; "
                "look at its log (a hung generate or storage call?)",
                level="warning",
                node=node,
                stuck_round=self._rounds.get(node),
            )
        for node in sorted((self._stalled - stalled) & live):
            self.log.event("worker_progressing", f"{node} plays again, round {self._rounds.get(node)}", node=node)
        if stalled != self._stalled:
            self.log.flush()
        self._stalled = stalled
        return stalled

    def progress_line(self, state: StateRecord, live: frozenset[str], always: bool = False) -> None:
        """A metric line of the swarm's progress (:meth:`SwarmProgress.line`, with ``swarm/live_workers`` and
        ``swarm/workers_done``) and a ``swarm_progress`` event with each worker's rounds done; nothing when no new
        reward was counted since the last, unless ``always``."""
        if not self.progress.pending and not (always and self.progress.rounds_done):
            return
        self.log.metric(
            {
                "swarm/live_workers": len(live),
                "swarm/workers_done": len(self.progress.done),
                **self.progress.line(),
            },
            round_=state.round,
        )
        rounds = self.progress.rounds_done
        shown = ", ".join(f"{node} {done}" for node, done in sorted(rounds.items()))
        self.log.event(
            "swarm_progress",
            f"rounds done (of {state.max_rounds}): {shown}",
            round_=state.round,
            nodes=sorted(rounds),
            rounds_done=[rounds[n] for n in sorted(rounds)],
        )
        self.log.flush()

    def _drain_async(self, state: StateRecord, live: frozenset[str]) -> None:
        """After an asynchronous experiment finished: the workers that were live and not done end the round they
        play (a deadline) or have just ended. Each, once seen stopped or silent (§6), has the rewards of the round
        its last record names counted (one listing a pass), for at most COORDINATOR_ROUND_INTERVAL + SYNC_LAG; then
        the last progress line. A stop ends it early (the state stays ``finished``)."""
        waited = self.clock()
        window = self.config.coordinator_round_interval + self.config.sync_lag
        backoff = Backoff(self.config.poll_interval_min, self.config.poll_interval_max)
        finishing = live - self.progress.done - self._stalled
        settled: set[str] = set()
        while finishing - settled and not self.stop.is_set() and self.clock() - waited < window:
            self.stop.wait(max(backoff.next(), 0.01))
            ended = sorted(finishing - settled - self.observe(self.clock(), every=False))
            if ended:
                node = ended[0]
                settled.add(node)
                if self._rounds.get(node) is not None:
                    self.count_progress(state, live, self._rounds[node])
        self.progress_line(state, live, always=True)

    def _async_status_changed(self, new: StateRecord, live: frozenset[str], reason: str) -> None:
        """The asynchronous experiment opened (``running``) or finished: an event, a metric line, a flush."""
        done = sorted(self.progress.done)
        if new.status == "running":
            summary = f"asynchronous rounds started with {len(live)} live workers"
            self.log.event("round_opened", summary, round_=new.round, reason="start", live=len(live), mode="async")
        else:
            if reason == "deadline":
                summary = (
                    f"{self.deadline_message()}: the {len(live)} live workers end after the round they play "
                    f"({len(done)} had played their {new.max_rounds} rounds)"
                )
            else:
                summary = f"every live worker played its {new.max_rounds} rounds: {', '.join(done)}"
            self.log.event(
                "experiment_finished", summary, round_=new.round, reason=reason, live=len(live), done=len(done)
            )
            self.log.metric({"swarm/live_workers": len(live), "swarm/workers_done": len(done)}, round_=new.round)
        logger.info("%s", summary)
        self.log.flush()

    def worker_rounds(self) -> dict[str, int]:
        """The round each live-known worker's last peer record read says it plays (an asynchronous experiment's
        progress; as fresh as the coordinator's reads of peer files, §6)."""
        return {node: record.round for node, (record, _) in sorted(self._alive.items()) if record.round is not None}

    def progress_message(self, state: StateRecord, live: frozenset[str]) -> str:
        """``asynchronous rounds: w1 at round 12, w2 at round 3 of 20; 0 done, 2 live``."""
        rounds = self.worker_rounds()
        shown = ", ".join(f"{node} at round {r}" for node, r in rounds.items()) or "no worker has started a round"
        stalled = f", stalled: {', '.join(sorted(self._stalled))}" if self._stalled else ""
        done = len(self.progress.done)
        return f"asynchronous rounds: {shown} of {state.max_rounds}; {done} done, {len(live)} live{stalled}"

    def prune_async(self, live: frozenset[str]) -> None:
        """With ROLLOUT_CLEANUP_ENABLED, the emptied rollout folders of rounds more than ROLLOUT_KEEP_LAST_N_ROUNDS
        behind the slowest live worker's round (§9; every 30 s, not every pass: each call lists ``rollouts/``)."""
        rounds = self.worker_rounds()
        # none while a live worker has not said its round yet: it may start at round 0
        if self.config.rollout_cleanup_enabled and live and live <= rounds.keys():
            self.prune_empty_round_dirs(min(rounds[n] for n in live) - self.config.rollout_keep_last_n_rounds)

    def _prepare_async_rounds(self, state: StateRecord, listed: bool = True) -> None:
        """The folders of the rounds just ahead of the furthest worker (:meth:`prepare_rounds` for one clock): one
        creator makes no duplicate round folders, as long as this node keeps ahead. The furthest round is the
        newest of the peer records' rounds, of the rounds the rewards counted say the workers play, and of the round
        folders in ``rewards/`` that a worker made (``listed``: one listing a pass; those this node made ahead do not
        count, or the lead would run away to MAX_ROUNDS): the records are read seldom for a beating worker (§6),
        and a coordinator that followed them alone fell behind fast workers, which then raced to create each
        round's folders (on Drive, up to 9 of one)."""
        present = (
            [
                r
                for _, r in self.exchange.numbered_folders(self.layout.rewards_dir, parse_round_dir)
                if not self.exchange.prepared(r)
            ]
            if listed
            else []
        )
        played = self.progress.rounds_done.values()
        furthest = max([*self.worker_rounds().values(), *played, *present], default=0)
        for round_ in range(furthest, min(furthest + ROUNDS_AHEAD + 1, state.max_rounds)):
            self.exchange.prepare_round(round_, state.num_stages)

    def _announce_stop(self, state: StateRecord) -> None:
        """Write the state as ``stopped`` (seq + 1): the workers that follow the rounds read it, finish their round,
        checkpoint and exit, instead of waiting COORDINATOR_WAIT_TIMEOUT for a round that will not open."""
        stopped = state.model_copy(update={"status": "stopped", "seq": state.seq + 1, "updated_at": time.time()})
        try:
            if not self._holds(state):  # another coordinator's state, or a planted one: left to the next start
                logger.warning("the state file no longer holds this coordinator's state: 'stopped' is not written")
                return
            self.exchange.write_state(stopped)
        except OSError as exc:  # the stop goes on: the workers then wait for it, as after a crash
            logger.warning(
                "could not write the state 'stopped' (%s): the workers wait for this coordinator up to "
                "COORDINATOR_WAIT_TIMEOUT",
                exc,
            )
            return
        message = (
            f"coordinator {self.node_id} stopped at round {state.round} ({state.status}): workers checkpoint and exit; "
            "start this coordinator again (same EXPERIMENT_NAME) to resume the round, then the workers"
        )
        self.log.event("coordinator_stopped", message, round_=state.round, status=state.status)
        logger.info("%s", message)

    def prepare_rounds(self, state: StateRecord) -> None:
        """Create the folders of the state's round and the next two before workers write into them: one creator,
        so no duplicate round folders; a round's folders are a round old when it opens, so readers on Drive
        look them up again less often (young folders are re-checked after half their age)."""
        if state.status == "finished":
            return
        rounds = [r for r in range(state.round, state.round + ROUNDS_AHEAD + 1) if r < state.max_rounds]
        for round_ in rounds:
            self.exchange.prepare_round(round_, state.num_stages)

    def _holds(self, state: StateRecord) -> bool:
        """Whether the state file still holds ``state``, the last this process wrote: read before each write of a
        new state (a listing of ``state/``; the file is downloaded only when it changed), so that this coordinator
        never writes over another coordinator's state unseen, which would start a tug of war."""
        found = self.exchange.read_state_file()
        return found is not None and _writer_key(found) == _writer_key(state) and found.instance == self.instance

    def _keep_own_state(self, state: StateRecord) -> StateRecord:
        """Read the state file and experiment.json back (every HEARTBEAT_INTERVAL): anything but the state this
        coordinator last wrote (a folder or garbage planted there, another writer's state) is replaced by that state
        with ``seq`` + 1, so workers are not left without a readable state until the next round opens; an
        experiment.json that is not this run's is written again (:meth:`_keep_own_experiment`). A state of another
        live coordinator that stays is no forgery: this one yields (:meth:`_face_rival`). Returns the state in
        force."""
        found = self.exchange.read_state_file()
        if found is not None and found.coordinator_id != self.node_id and found.instance != self.instance:
            self._face_rival(found, state)  # raises when it is a live coordinator's state, and stays
            found = self.exchange.read_state_file()
        self._keep_own_experiment()
        if found is not None and _writer_key(found) == _writer_key(state) and found.instance == self.instance:
            return state
        path = self.layout.state_file
        if found is None:
            why = self.exchange.rejection(path) or "missing"
        else:
            why = f"round {found.round} seq {found.seq} of run {found.run_id} by {found.coordinator_id!r}"
        # Newer than what is there too (a forger's seq, as far as 64 bits go), so every reader's memory takes it.
        seq = max(state.seq, found.seq if found is not None and found.run_id == state.run_id else 0) + 1
        restored = state.model_copy(
            update={
                "seq": seq if seq < 2**63 else state.seq + 1,
                "updated_at": time.time(),
                "instance": self.instance,
            }
        )
        # clears what blocks it (a folder, a link) as every write of its own does
        restored = self.exchange.write_state(restored)
        self._restored = True
        self.log.event(
            "state_restored",
            f"{path} was not this coordinator's ({why}): wrote round {state.round} ({state.status}) again",
            level="warning",
            round_=state.round,
        )
        return restored

    def _keep_own_experiment(self) -> None:
        """experiment.json, read back with the state: one that no longer names this run as this coordinator wrote or
        resumed it (run_id, fingerprint, coordinator_id, mode) is written again, with a warning. Workers end on a run
        change only once both files have named the other run for a while (trust.py), so a forged run_id heals by
        itself, and a worker restarted meanwhile joins the real run once it is back."""
        mine = self._experiment
        if mine is None:
            return
        found = self.exchange.read_experiment()
        fields = ("run_id", "fingerprint", "coordinator_id", "mode", "public_key")
        if found is not None and all(getattr(found, f) == getattr(mine, f) for f in fields):
            if self.key is None or found == mine:  # signed: its every byte is the coordinator's, or a pinned
                return  # worker restarted meanwhile would wait for it
            fields = (*fields, "signature")
        if found is not None and self._beating_rival(found.coordinator_id):
            # One that took over with RESET_EXPERIMENT, between its experiment.json and its first state: not
            # written over; its state decides at the next read-back (_face_rival).
            logger.warning(
                "experiment.json names run %s of coordinator %r, which runs", found.run_id, found.coordinator_id
            )
            return
        path = self.layout.experiment_file
        if found is None:
            why = self.exchange.rejection(path) or "missing"
        else:
            why = ", ".join(
                f"{f} {getattr(found, f)!r}" if f != "signature" else "a signature not this coordinator's"
                for f in fields
                if getattr(found, f) != getattr(mine, f)
            )
        self.exchange.write_experiment(mine)
        self._restored = True
        self.log.event(  # the coordinator's own files, read back: the state's event, for either of them
            "state_restored",
            f"{path} was not this run's ({why}): wrote run {mine.run_id} of coordinator {mine.coordinator_id!r} again",
            level="warning",
        )

    # -- another coordinator ---------------------------------------------------------------

    def _coordinator_peer(self, node: str) -> PeerRecord | None:
        """``node``'s peer file when it says an alive coordinator (of any run: one that took over may have reset the
        experiment); None otherwise (absent, unreadable, a worker's, stopped)."""
        try:
            data = self.exchange.storage.read_bytes(self.layout.peer_file(node), MAX_BYTES["peer"])
            record = decode(data, PeerRecord)
        except (OSError, RecordError):
            return None
        alive = record.node_id == node and record.role == "coordinator" and record.status == "alive"
        return record if alive else None

    def _beating_rival(self, node: str) -> bool:
        """Whether ``node``, another coordinator than this one and the one it took over, beats (:meth:`_watch_rival`).
        A peer file found frozen is not watched again while it stays as it is, so a planted one cannot stall this
        coordinator at each read-back."""
        if node in (self.node_id, self._taken_over):
            return False
        peer = self._coordinator_peer(node)
        if peer is None or (node, peer.registered_at, peer.heartbeat) in self._frozen:
            return False
        if self._watch_rival(node) is not None:
            return True
        self._frozen.add((node, peer.registered_at, peer.heartbeat))
        return False

    def _rival_window(self) -> float:
        """How long another coordinator's heartbeat is watched: a running one beats at least once in it (as a
        NODE_ID twin is watched, §7), and its state stays at least the workers' confirmation window."""
        hb, lag = self.config.heartbeat_interval, self.config.sync_lag
        return max(2 * hb + lag, CONFIRM_SECONDS + lag)

    def _watch_rival(
        self, node: str, still: Callable[[], bool] | None = None, window: float | None = None
    ) -> str | None:
        """Watch ``node``'s peer file for :meth:`_rival_window` seconds: what shows that a coordinator is beating
        there (its heartbeat rose, or another registration replaced it), or None (absent, not a coordinator's, or
        frozen: a dead one, or a file planted once); ``window`` replaces that length. Without ``still`` the watch
        ends at the first rise; with it, it lasts the whole window, ``still`` is asked at each look, and False ends
        it (None). Raises
        :class:`Stopped` when this node is stopped meanwhile."""
        first = self._coordinator_peer(node)
        if first is None:
            return None
        window = self._rival_window() if window is None else window
        started = self.clock()
        risen: str | None = None
        while True:
            elapsed = self.clock() - started
            if still is None and risen is not None:
                return risen
            if still is not None and not still():
                return None
            if elapsed >= window:
                return risen
            if self.stop.wait(min(self.config.heartbeat_interval / 2, max(window - elapsed, 0.01))):
                raise Stopped()
            seen = self._coordinator_peer(node)
            rose = seen is not None and (seen.registered_at != first.registered_at or seen.heartbeat > first.heartbeat)
            if risen is None and rose:
                risen = (
                    f"its heartbeat in {self.layout.peer_file(node)} went from {first.heartbeat} to "
                    f"{seen.heartbeat} in {self.clock() - started:.1f} s"
                )

    def _refuse_live_rival(self) -> None:
        """At start, before anything is written: a ``waiting`` or ``running`` state of another coordinator (another
        NODE_ID) whose heartbeat still beats means that coordinator runs the experiment. Without
        COORDINATOR_TAKEOVER this one refuses (:class:`RivalCoordinatorError`, exit code 2); with it, this one goes
        on and the other yields once it sees this one's state (:meth:`_face_rival`). A coordinator restarted after
        its own death (same NODE_ID; a live twin is refused by the launcher) or after the other's death (frozen
        heartbeat: up to :meth:`_rival_window` seconds' watch) resumes as before."""
        found = self.exchange.read_state_file()
        if found is None or found.status not in ("waiting", "running") or found.coordinator_id == self.node_id:
            return
        rival = found.coordinator_id
        if self._coordinator_peer(rival) is not None:
            logger.info(
                "the state was written by coordinator %r: watching its heartbeat %.1f s to see whether it still runs",
                rival,
                self._rival_window(),
            )
        beat = self._watch_rival(rival)
        if beat is None:
            return
        who = (
            f"coordinator {rival!r} (instance {found.instance or 'not given'}) runs this experiment: it last wrote "
            f"the state (round {found.round}, {found.status}) {max(0.0, time.time() - found.updated_at):.1f} s ago by "
            f"this node's clock, and {beat}"
        )
        if not self.config.coordinator_takeover:
            raise RivalCoordinatorError(
                f"EXPERIMENT_NAME={self.config.experiment_name!r}: {who}. Stop it, or wait until it is gone (a "
                f"coordinator whose heartbeat stopped for {self._rival_window():g} s is not in the way), or set "
                f"COORDINATOR_TAKEOVER=true to take over (it then exits with code 2); see docs/operations.md, "
                "'Two coordinators'"
            )
        self._taken_over = rival
        logger.warning("COORDINATOR_TAKEOVER: %s; this one takes over, and it exits once it sees this one's state", who)

    def _face_rival(self, found: StateRecord, own: StateRecord) -> None:
        """The state file holds ``found``, written by another coordinator (another NODE_ID). Whether this one yields:

        - the coordinator this one took over from (COORDINATOR_TAKEOVER): never; its state is overwritten, and it
          yields once it sees this one's;
        - no alive coordinator's peer file of that name: a forgery, overwritten at once (as a planted state always
          was);
        - otherwise this one writes nothing while it watches that coordinator's heartbeat for :meth:`_rival_window`
          seconds: if it beats and its state is still in the file, it took over (or was started beside this one and
          wrote last): this one logs an error naming it and raises :class:`RivalCoordinatorError` (exit code 2).
          If its state goes away (this one's own in the file again: the other yielded), or its heartbeat is frozen,
          this one goes on, and a state not its own is overwritten.

        One file, read by both: the one whose state is not in it yields, the other does not, so two coordinators end
        with one, never a livelock. Workers never play a state the experiment's key did not sign, whatever this one
        does here; the watch stays for all, so that one that took over with the key file is yielded to."""
        rival = found.coordinator_id
        peer = self._coordinator_peer(rival)
        if rival == self._taken_over or peer is None or (rival, peer.registered_at, peer.heartbeat) in self._frozen:
            return
        logger.warning(
            "the state file holds coordinator %r's state (instance %s, round %d seq %d): writing nothing for %.1f s "
            "while watching whether it runs",
            rival,
            found.instance or "not given",
            found.round,
            found.seq,
            self._rival_window(),
        )

        def still() -> bool:
            now = self.exchange.read_state_file()
            return now is not None and now.coordinator_id == rival and now.instance != self.instance

        beat = self._watch_rival(rival, still)
        if beat is None and still():  # its heartbeat did not move: not watched again while its file stays so
            self._frozen.add((rival, peer.registered_at, peer.heartbeat))
        if beat is None or not still():
            return
        message = (
            f"coordinator {rival!r} (instance {found.instance or 'not given'}) took over experiment "
            f"{self.config.experiment_name!r}: its state (round {found.round}, {found.status}) stayed in "
            f"{self.layout.state_file} for {self._rival_window():g} s and {beat}. This coordinator ({self.node_id!r}, "
            f"instance {self.instance}) exits and leaves the experiment to it; to run this one instead, stop that one "
            "first, or start this one with COORDINATOR_TAKEOVER=true (docs/operations.md, 'Two coordinators')"
        )
        self.log.event("coordinator_overtaken", message, level="error", rival=rival)
        self._withdraw_experiment(found, own)
        self.log.flush()
        raise RivalCoordinatorError(message)

    def _withdraw_experiment(self, rival: StateRecord, own: StateRecord) -> None:
        """Yielding to a coordinator started beside this one (``rival``'s state, of another run, stayed): the
        experiment.json of the run this process created, if it is still the one in the file, is removed, so that a
        worker joining in the seconds before the other writes its own back (after watching this one's heartbeat stop)
        waits for that one instead of pinning this one's key. Only while its run is still ``waiting`` (no round
        opened): a run with rounds keeps it, so that a restart resumes it (a participant faking a rival's heartbeat
        can make this coordinator yield, §13); and a takeover of this run keeps it."""
        mine = self._experiment
        if mine is None or not self._created_here or own.status != "waiting" or rival.run_id == mine.run_id:
            return
        if self.exchange.read_experiment() != mine:
            return
        try:
            self.exchange.storage.delete(self.layout.experiment_file)
        except OSError as exc:
            logger.warning("could not remove the experiment.json of run %s: %s", mine.run_id, exc)
            return
        logger.info("removed the experiment.json of run %s, which this coordinator created", mine.run_id)

    def _publish(
        self, old: StateRecord, decision: Decision, live: frozenset[str], submitted: frozenset[str], now: float
    ) -> StateRecord:
        """Write the decided state (signed, when this coordinator has a key); returns it as written."""
        new = decision.state
        assert new is not None
        new = self.exchange.write_state(new)
        if new.round != old.round or new.status != old.status:
            missing = sorted(live - submitted)
            if old.status == "running" and decision.reason in ("interval", "deadline") and missing:
                self._closed_on_deadline(old, missing, now)
            if decision.reason == "deadline":
                played = f"after round {old.round}" if new.round > old.round else f"before round {new.round} was played"
                summary = f"{self.deadline_message()}: finished {played}" + (f", missing {missing}" if missing else "")
            elif old.status == "waiting":
                summary = f"round {new.round} opened with {len(live)} live workers"
            else:
                summary = (
                    f"round {old.round} -> {new.round} ({decision.reason}); live {len(live)}, "
                    f"submitted {len(submitted)}" + (f", missing {missing}" if missing else "")
                )
            self.log.event(
                {"waiting": "round_opened", "running": "round_advanced"}[old.status]
                if new.status != "finished"
                else "experiment_finished",
                summary,
                round_=old.round,
                reason=decision.reason,
                to_round=new.round,
                live=len(live),
                submitted=len(submitted),
            )
            self.log.metric(
                {
                    "swarm/live_workers": len(live),
                    "swarm/submitted": len(submitted),
                    "swarm/advanced_on_interval": int(decision.reason == "interval"),
                },
                round_=old.round,
            )
            self.log.flush()
            if self.config.rollout_cleanup_enabled and old.status == "running":
                self.prune_empty_round_dirs(new.round - self.config.rollout_keep_last_n_rounds)
        return new

    # -- first-hour feedback and late rewards ---------------------------------------------

    def report_waiting(self, live: frozenset[str], now: float) -> None:
        """While round 0 waits for MIN_WORKERS: say whom it waits for, when that changes (an event) and every
        WAITING_REPORT_SECONDS (a log line)."""
        registered = frozenset(self.workers_seen)
        said = self._waiting_said
        changed = said is None or (live, registered) != said[:2]
        if not changed and now - said[2] < WAITING_REPORT_SECONDS:
            return
        self._waiting_said = (live, registered, now)
        message = self.waiting_message(live, registered)
        if changed:
            self.log.event(
                "waiting_for_workers",
                message,
                round_=0,
                live=sorted(live),
                registered=sorted(registered),
                needed=self.config.min_workers,
            )
            self.log.flush()  # visible to the monitor now, not only once round 0 opens
        else:
            logger.info("%s", message)

    def waiting_message(self, live: frozenset[str], registered: frozenset[str]) -> str:
        """``2 of 3 workers live: worker-1, worker-2`` and what to do about the others."""
        needed = self.config.min_workers
        message = f"waiting for MIN_WORKERS={needed}: {len(live)} of {needed} workers live"
        if live:
            message += ": " + ", ".join(sorted(live))
        silent = sorted(registered - live)
        if silent:
            message += (
                f"; registered but not live (stopped, or no heartbeat for {self.config.liveness_timeout:g} s): "
                + ", ".join(silent)
            )
        if not registered:
            message += (
                f"; no worker has registered yet: start workers with the same GDRIVE_PATH and "
                f"EXPERIMENT_NAME={self.config.experiment_name}"
            )
            if self.config.sync_lag:
                message += f" (a new worker's heartbeat can take SYNC_LAG={self.config.sync_lag:g} s to get here)"
        return message

    def _closed_on_deadline(self, old: StateRecord, missing: list[str], now: float) -> None:
        """Say that round ``old.round`` closed on the deadline, and keep counting its late rewards."""
        lag = self.config.sync_lag
        hint = (
            f"if they are working, their rewards reach this node later than SYNC_LAG={lag:g} s allows: raise "
            "SYNC_LAG to the folder's real lag (or COORDINATOR_ROUND_INTERVAL if rounds take longer to train)"
            if lag
            else "if they are working on a Drive mount or Drive for desktop, set SYNC_LAG to its lag (60-120 s) so "
            "that the timeouts follow it, or raise COORDINATOR_ROUND_INTERVAL if rounds take longer to train"
        )
        self.log.event(
            "round_closed_on_deadline",
            f"round {old.round} closed on the deadline (COORDINATOR_ROUND_INTERVAL="
            f"{self.config.coordinator_round_interval:g} s) without rewards from {', '.join(missing)}: {hint}",
            level="warning",
            round_=old.round,
            missing=missing,
            interval=self.config.coordinator_round_interval,
        )
        self.late[old.round] = _LateWatch(old.num_stages - 1, set(missing), now)

    def watch_late(self, now: float, window: float) -> None:
        """Count the rewards of rounds closed on the deadline that arrive afterwards (``late_submission``).

        A round is watched until every worker missing at its close has submitted or ``window`` seconds have
        passed; then one metric line of that round says how many came late (``swarm/late_submitted``) and
        how many never came (``swarm/never_submitted``).
        """
        for round_, watch in sorted(self.late.items()):
            arrived = set(self.exchange.read_rewards(round_, watch.stage, only=watch.missing))
            for node in sorted(arrived):
                self.log.event(
                    "late_submission",
                    f"{node}'s reward for round {round_} arrived {now - watch.closed_at:.0f} s after the round closed "
                    f"on the deadline: counted, but the round went on without it (SYNC_LAG="
                    f"{self.config.sync_lag:g} s, COORDINATOR_ROUND_INTERVAL="
                    f"{self.config.coordinator_round_interval:g} s)",
                    level="warning",
                    round_=round_,
                    node=node,
                    late_s=round(now - watch.closed_at, 3),
                )
            watch.missing -= arrived
            watch.arrived += len(arrived)
            if not watch.missing or now - watch.closed_at >= window:
                self.log.metric(
                    {"swarm/late_submitted": watch.arrived, "swarm/never_submitted": len(watch.missing)},
                    round_=round_,
                )
                del self.late[round_]
                self.log.flush()

    def _drain(self) -> None:
        """After the last round: wait up to SYNC_LAG for the rewards of rounds that closed on the deadline, which
        may still be on their way to this node, so that the experiment's record counts them."""
        if not self.late:
            return
        if self.config.sync_lag:
            logger.info(
                "finished; waiting up to SYNC_LAG=%g s for late rewards of round(s) %s",
                self.config.sync_lag,
                ", ".join(str(r) for r in sorted(self.late)),
            )

        def settled() -> bool | None:
            self.watch_late(self.clock(), math.inf)
            return True if not self.late else None

        backoff = Backoff(self.config.poll_interval_min, self.config.poll_interval_max)
        wait_for(settled, self.stop, self.config.sync_lag, backoff)
        self.watch_late(self.clock(), 0.0)  # a last look; what has not come by now closes every watch

    def prune_empty_round_dirs(self, before_round: int) -> None:
        """Remove rollout folders of rounds older than ``before_round`` once workers emptied them (best effort:
        a file planted where a folder belongs is logged and left, never a crash)."""
        removed = self.exchange.remove_empty_rollout_dirs(before_round)
        if removed:
            logger.info("removed %d emptied rollout folders of rounds before %d", removed, before_round)
