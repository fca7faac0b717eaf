"""Which coordinator state a worker may act on: the trust rule of GDRIVE_IMPLEMENTATION.md §5.5.

In an experiment whose experiment.json names a coordinator key (protocol/signing.py), the worker pinned that key
when it joined (``key``): a state the key did not sign is never played, however long it stays, nor does it hide a
signed one; a run change is followed at once when the key signed both the state and an experiment.json created
after the worker's run (a reset by the coordinator), never otherwise. A signed state newer than the trusted one is
trusted at once (the coordinator wrote it), except a ``finished`` one read before any other: that one is played
only once it stayed ``confirm_s``, so that a finished state of the run put back in place (before MAX_ROUNDS was
raised) does not end a worker that just started. Older signed states (a replay) are not newer: the memory below.

In an experiment created before keys existed, anyone with write access to the folder can write a valid state file,
and nothing authenticates it. A worker therefore plays a state at once only when an honest coordinator could have
written it next: the same run as experiment.json, the experiment's coordinator (or one already confirmed), and at
most one round past the newest state it trusts (the coordinator advances one round at a time) and below its
``max_rounds``. Any other newer state (a jump, ``finished``, ``stopped``, another coordinator) is played only once
it has stayed in the file for ``confirm_s`` seconds; one that goes away sooner is rejected and never played, so a
forged state visible for a moment changes nothing. A state of another run ends the worker only when experiment.json
names that run too, both name the same coordinator, and both have stayed so for ``run_change_s`` seconds (a real
reset); otherwise it is rejected. A participant who rewrites both files at once does not end the swarm: the
coordinator reads both back every HEARTBEAT_INTERVAL and writes its own again (a forged run change then heals by
itself), so ``run_change_s`` is longer than that.

The memory works the other way too: when every state the file shows has been older than the trusted
one, or more than one round behind the worker's own progress, for ``confirm_s`` seconds, the trusted
state (or the worker's local ``last_round``) was not the coordinator's, and the worker follows the file
again (:attr:`StateFollower.overdue`); :meth:`StateFollower.next_target` says which round to play.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from swarm_gdrive.protocol.exchange import Exchange, RunChangedError
from swarm_gdrive.protocol.records import ExperimentRecord, StateRecord
from swarm_gdrive.protocol.signing import self_signed, short, signed_by

logger = logging.getLogger(__name__)

#: Seconds a suspicious state must stay in the file before a worker acts on it (plus SYNC_LAG).
CONFIRM_SECONDS = 2.0
#: Seconds between two log lines (and events) for states the pinned key did not sign: a forger rewriting the file
#: cannot flood a worker's log.
UNSIGNED_REPORT_SECONDS = 30.0

RejectHook = Callable[[str, str], None]


class StateFollower:
    """The newest state a worker trusts, read through :meth:`read` at each poll."""

    def __init__(
        self,
        exchange: Exchange,
        experiment: ExperimentRecord,
        last_round: int | None,
        confirm_s: float,
        on_reject: RejectHook | None = None,
        clock: Callable[[], float] = time.monotonic,
        run_change_s: float | None = None,
        key: str | None = None,
    ) -> None:
        self.exchange = exchange
        #: The coordinator key this worker pinned (None: an experiment without one, §5.5's unsigned rule).
        self.key = key
        self._unsigned: tuple[float, int] | None = None  # when an unsigned state was last reported, and how many since
        self.experiment = experiment
        self.confirm_s = confirm_s
        #: How long another run must stay in both the state and experiment.json before this worker ends.
        self.run_change_s = confirm_s if run_change_s is None else max(confirm_s, run_change_s)
        self._run_change: tuple[str, float] | None = None  # the other run both files name, and since when
        self.trusted: StateRecord | None = None
        self.overdue = False  # the file has been behind the trusted state or the worker's progress for confirm_s
        self._anchor = -1 if last_round is None else last_round  # before any state is trusted
        self._coordinators = {experiment.coordinator_id}
        self._candidate: tuple[StateRecord, float, str] | None = None
        self._behind_since: float | None = None
        self._floor = -1  # a target next_target found backed by this worker's own rewards
        self._on_reject = on_reject
        self._said: str | None = None
        self._clock = clock

    @property
    def path(self) -> str:
        return self.exchange.layout.state_file

    def read(self, target: int) -> StateRecord | None:
        """Read the state file once; the trusted state (None before the first one).

        ``target`` is the round the worker waits for. Raises :class:`RunChangedError` when the state and
        experiment.json both name another run than the worker's (the experiment was reset).
        """
        now = self._clock()
        state = self.exchange.read_state_file()
        if state is not None and self.key is not None and not signed_by(state, self.key):
            self._reject_unsigned(state, now)  # as if the file were unchanged: a pending signed candidate stays
            return self.trusted
        if state is None or state.run_id == self.experiment.run_id:
            self._run_change = None  # another run must stay in the file without a break
        if state is None or not self._same_run(state, now):
            return self.trusted
        candidate = self._candidate[0] if self._candidate is not None else None
        if candidate is not None and state != candidate and not state.is_newer_than(candidate):
            self._drop_candidate()  # the file shows neither it nor a newer state: it went away
        if self.trusted is None or state.is_newer_than(self.trusted):
            self._consider(state, now)
        self._watch_behind(state, target, now)
        return self.trusted

    def next_target(self, state: StateRecord, target: int) -> int:
        """After :attr:`overdue`: the round to play next, from the coordinator's ``state``.

        The first round from ``state.round`` on (below ``target``) for which this worker's own reward
        of the last stage is not in the folder: no round it submitted is played twice (a coordinator
        that went back, e.g. resumed from an old state, finds those rewards and moves on), and none the
        coordinator opens is given up. Rounds played on a forged state leave a gap right after
        ``state.round``, so the scan stops there.
        """
        self.overdue = False
        last_stage = state.num_stages - 1
        new = state.round
        while new < target and self.exchange.node_id in self.exchange.read_rewards(new, last_stage):
            new += 1
        self._floor = new
        return new

    # -- the rule --------------------------------------------------------------------------

    def _same_run(self, state: StateRecord, now: float) -> bool:
        if state.run_id == self.experiment.run_id:
            if state.mode != self.experiment.mode:  # a state of another ROUND_MODE is no state of this run
                self._reject(f"mode {state.mode} is not experiment.json's ({self.experiment.mode}): not played")
                return False
            return True
        now_defined = self.exchange.read_experiment()
        if self.key is not None:
            return self._signed_run_change(state, now_defined)
        if (
            now_defined is not None
            and now_defined.run_id == state.run_id
            and now_defined.coordinator_id == state.coordinator_id
        ):
            # A reset, or both files forged: the coordinator writes its own back within HEARTBEAT_INTERVAL.
            if self._run_change is None or self._run_change[0] != state.run_id:
                self._run_change = (state.run_id, now)
                logger.info(
                    "the state and experiment.json name run %s of coordinator %r, not run %s: this worker ends only "
                    "if both still do in %g s",
                    state.run_id,
                    state.coordinator_id,
                    self.experiment.run_id,
                    self.run_change_s,
                )
            elif now - self._run_change[1] >= self.run_change_s:
                raise RunChangedError(
                    f"the state now belongs to run {state.run_id}, not {self.experiment.run_id}, and experiment.json "
                    f"has named it for {self.run_change_s:g} s"
                )
            return False
        self._run_change = None
        if now_defined is not None and now_defined.run_id == state.run_id:
            self._reject(
                f"run_id {state.run_id} by coordinator {state.coordinator_id!r}, but experiment.json names "
                f"{now_defined.coordinator_id!r}: not played"
            )
            return False
        defined = now_defined.run_id if now_defined is not None else "absent"
        self._reject(f"run_id {state.run_id} is not experiment.json's ({defined}): not played")
        return False

    def _signed_run_change(self, state: StateRecord, defined: ExperimentRecord | None) -> bool:
        """A state of another run that the pinned key signed: a reset when experiment.json names that run, signed by
        the key and created after this worker's run (raises :class:`RunChangedError`); otherwise rejected (an older
        run of the key put back, or experiment.json not yet written)."""
        if (
            defined is not None
            and defined.run_id == state.run_id
            and defined.public_key == self.key
            and self_signed(defined)
            and defined.created_at > self.experiment.created_at
        ):
            raise RunChangedError(
                f"coordinator key {short(self.key)} signed run {state.run_id}, created after run "
                f"{self.experiment.run_id}, in the state and in experiment.json"
            )
        self._reject(f"run_id {state.run_id} is not this worker's run, and no newer experiment.json of it: not played")
        return False

    def _reject_unsigned(self, state: StateRecord, now: float) -> None:
        """A state the pinned key did not sign: never played; one log line (and event) per UNSIGNED_REPORT_SECONDS,
        with the count of those not reported since."""
        if self._unsigned is not None and now - self._unsigned[0] < UNSIGNED_REPORT_SECONDS:
            self._unsigned = (self._unsigned[0], self._unsigned[1] + 1)
            return
        more = f" ({self._unsigned[1]} more since the last such line)" if self._unsigned and self._unsigned[1] else ""
        self._unsigned = (now, 0)
        self._said = None
        self._reject(
            f"round {state.round} seq {state.seq} ({state.status}, run {state.run_id}, by {state.coordinator_id!r}) "
            f"is not signed by the coordinator key this worker pinned ({short(self.key)}): not played{more}"
        )

    def _suspicion(self, state: StateRecord) -> str | None:
        """Why an honest coordinator could not have written ``state`` next; None if it could."""
        if self.key is not None and (self.trusted is not None or state.status != "finished"):
            return None  # signed by the pinned key (read checked it): the coordinator's
        base = self.trusted.round if self.trusted is not None else self._anchor
        if state.coordinator_id not in self._coordinators:
            expected = self.experiment.coordinator_id
            return f"written by coordinator {state.coordinator_id!r}, not experiment.json's {expected!r}"
        if state.status == "finished":
            return "it finishes the experiment"
        if state.status == "stopped":
            return "it says the coordinator stopped"
        if state.round > base + 1:
            return f"round {state.round} is more than one round ahead of round {base}"
        if self.trusted is not None and state.round >= self.trusted.max_rounds:
            return f"round {state.round} is beyond MAX_ROUNDS ({self.trusted.max_rounds})"
        if self.trusted is not None and state.max_rounds != self.trusted.max_rounds:  # only a restart changes it
            return f"MAX_ROUNDS changes from {self.trusted.max_rounds} to {state.max_rounds}"
        return None

    def _consider(self, state: StateRecord, now: float) -> None:
        """A state newer than the trusted one: trust it now, or once it has stayed confirm_s seconds."""
        reason = self._suspicion(state)
        if reason is None:
            if self._candidate is not None:  # a state an honest coordinator could write next replaced it: never played
                self._drop_candidate()
            self._trust(state)
            return
        if self._candidate is None:
            self._candidate = (state, now, reason)
            logger.info(
                "state of round %d seq %d (%s): played only if it is still there in %g s",
                state.round,
                state.seq,
                reason,
                self.confirm_s,
            )
            return
        if now - self._candidate[1] >= self.confirm_s:
            logger.info(
                "state of round %d seq %d stayed %g s (%s): playing it", state.round, state.seq, self.confirm_s, reason
            )
            self._coordinators.add(state.coordinator_id)
            self._trust(state)

    def _trust(self, state: StateRecord) -> None:
        self.trusted = state
        self._candidate = None

    def _drop_candidate(self) -> None:
        state, _, reason = self._candidate  # type: ignore[misc]
        self._candidate = None
        self._reject(
            f"round {state.round} seq {state.seq}: {reason}, and it went away within {self.confirm_s:g} s "
            "(a forged or transient state): not played"
        )

    def _watch_behind(self, state: StateRecord, target: int, now: float) -> None:
        """Follow the file again once it has stayed behind the trusted state or the worker's progress."""
        # progress no reward of its own backs; an asynchronous experiment's round is no clock a worker follows
        ahead = state.mode == "sync" and state.round < target - 1 and target > self._floor
        behind = (self.trusted is not None and self.trusted.is_newer_than(state)) or ahead
        if not behind:
            self._behind_since = None
            return
        if self._behind_since is None:
            self._behind_since = now
            return
        if now - self._behind_since >= self.confirm_s:
            if self.trusted is not None and self.trusted.is_newer_than(state):
                self._reject(
                    f"round {self.trusted.round} seq {self.trusted.seq}, played earlier, was not the coordinator's: "
                    f"its state stayed at round {state.round} seq {state.seq} for {self.confirm_s:g} s"
                )
            self._behind_since = None
            self._candidate = None
            self.trusted = state
            self.overdue = ahead

    def _reject(self, reason: str) -> None:
        if reason == self._said:  # polled again, same verdict: said once already
            return
        self._said = reason
        logger.warning("rejected %s: %s", self.path, reason)
        if self._on_reject is not None:
            self._on_reject(self.path, reason)
