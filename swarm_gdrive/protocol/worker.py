"""The worker runtime: follows the round clock, runs its workload, shares and gathers rollouts.

Each round: wait for the state (poll with backoff), skip to the current round if behind,
then for each stage generate, publish (per ROLLOUT_PUBLISH_FREQUENCY), gather other nodes'
rollouts of the stage within a bounded wait, re-score them locally, pick J (SAPO),
train, and submit a reward. Metrics and events are buffered and flushed once a round.

In an asynchronous experiment (the state's ``mode``, ROUND_MODE=async) the worker plays its own rounds back to
back instead, from its last completed round + 1 to MAX_ROUNDS - 1: the same stages, files and records, but the
external groups come from a :class:`~swarm_gdrive.protocol.pickup.Pickup` that never waits, and the state is
only read between rounds, for the end of the experiment or the coordinator's stop.
"""

from __future__ import annotations

import logging
import math
import threading
import time

from swarm_gdrive import logctx, progress
from swarm_gdrive.protocol.coordinator import ExperimentMismatchError
from swarm_gdrive.protocol.exchange import Exchange, RunChangedError, retention_seconds
from swarm_gdrive.protocol.gather import Gathered, PeerGather
from swarm_gdrive.protocol.heartbeat import Heartbeat
from swarm_gdrive.protocol.identity import Identity
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.metrics import NodeLog
from swarm_gdrive.protocol.pickup import PEERS_REUSE_S, Pickup
from swarm_gdrive.protocol.polling import BRISK_FRACTION, Backoff, Pacer, RoundClock, Stopped, wait_for
from swarm_gdrive.protocol.records import (
    EvalRecord,
    ExperimentRecord,
    RewardRecord,
    RolloutBatch,
    RolloutGroup,
    StateRecord,
)
from swarm_gdrive.protocol.sapo import ScoredGroup, Selection
from swarm_gdrive.protocol.settings import ProtocolSettings
from swarm_gdrive.protocol.signing import pin_of, pin_verdict, short
from swarm_gdrive.protocol.tracking import tracking_for
from swarm_gdrive.protocol.trust import CONFIRM_SECONDS, StateFollower
from swarm_gdrive.protocol.workload import StageContext, Workload
from swarm_gdrive.storage import Storage
from swarm_gdrive.storage.base import StorageUnavailableError

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_GAVE_UP = 3


class GiveUpError(RuntimeError):
    """The worker cannot go on (coordinator silent, experiment reset); the message says why."""


class CoordinatorSilentError(GiveUpError):
    """The round state did not move for COORDINATOR_WAIT_TIMEOUT (a crashed or stopped coordinator): the worker
    keeps its training in a stop checkpoint before it exits 3."""


class CoordinatorStoppedError(RuntimeError):
    """The coordinator this worker followed was stopped: the state it wrote, ``stopped``."""

    def __init__(self, state: StateRecord) -> None:
        super().__init__(f"coordinator {state.coordinator_id} stopped the experiment at round {state.round}")
        self.state = state


class Worker:
    """Runs rounds for one worker node until the experiment finishes or the node is stopped."""

    def __init__(
        self, config: ProtocolSettings, storage: Storage, identity: Identity, workload: Workload, stop: threading.Event
    ) -> None:
        self.config = config
        self.node_id = identity.node_id
        self.identity = identity
        self.layout = Layout(config.experiment_name)
        self.exchange = Exchange(storage, self.layout, self.node_id)
        self.workload = workload
        self.stop = stop
        self.log = NodeLog(storage, self.layout, self.node_id)
        self.tracking = tracking_for(config, self.node_id)
        self.log.sinks.append(self.tracking.log)
        self.exchange._on_reject = self._rejected
        self.heartbeat: Heartbeat | None = None
        self.experiment: ExperimentRecord | None = None
        self.states: StateFollower | None = None
        self._twin: str | None = None  # set when this process stepped down for another one with its NODE_ID
        self._followed = False  # this process has played by a state that was not ``stopped``
        self._said_stopped: int | None = None  # the seq of the stopped state whose wait was announced
        self._backend_mark: dict[str, int] = {}
        self._reward: float | None = None  # the last stage's submitted reward
        # (round, stages trained) while a round is trained in part: its first stages' updates are in the model, its
        # end (``end_round``) is not; a stop then saves no checkpoint (_checkpoint_on_stop)
        self._part_played: tuple[int, int] | None = None
        self._round_seconds: list[float] = []  # the last rounds' lengths: the time left in the round line
        self._state_backoff = Backoff(config.poll_interval_min, config.poll_interval_max)
        # Waiting for the next round: brisk around the moment it is expected to open (RoundClock), backed off
        # before and after, so the pickup is quick without every worker polling fast all the time.
        self._state_pacer = Pacer(self._state_backoff, config.poll_interval_min * BRISK_FRACTION)
        self.rounds = RoundClock()
        self._gather_backoff = Backoff(config.poll_interval_min, min(config.poll_interval_max, 2.0))
        self._pickup: Pickup | None = None  # set while this worker plays its own rounds (an asynchronous experiment)
        self._mode_noted = False  # the INFO line saying that this worker follows the experiment's mode was written

    def _rejected(self, path: str, reason: str) -> None:
        self.log.event("file_rejected", f"{path}: {reason}", level="warning", path=path)

    # -- lifecycle -------------------------------------------------------------------------

    def run(self) -> int:
        """0 when finished or stopped; 3 when it had to give up."""
        try:
            run_id = self._join()
            self.heartbeat = Heartbeat(
                self.exchange,
                "worker",
                run_id,
                self.config.heartbeat_interval,
                quiet_s=self.config.sync_lag,
                on_twin=self._on_twin,
            )
            self.heartbeat.start()
            self.tracking.start(run_id)
            self.log.event("worker_started", f"joined run {run_id}", run_id=run_id)
            self._rounds()
            return EXIT_OK
        except Stopped:
            if self._twin is not None:
                self.log.event("worker_gave_up", self._twin, level="error")
                return EXIT_GAVE_UP
            saved = self._checkpoint_on_stop()
            self.log.event("worker_stopped", "stopped on request" + saved)
            return EXIT_OK
        except CoordinatorStoppedError as exc:
            logger.warning("%s: this worker stops too", exc)
            saved = self._checkpoint_on_stop()
            message = (
                f"{exc}: this worker stopped{saved}. To go on: start coordinator {exc.state.coordinator_id} again "
                "(same GDRIVE_PATH and EXPERIMENT_NAME), then this worker; it resumes from its latest checkpoint"
            )
            self.log.event("coordinator_stopped", message, level="warning", round_=exc.state.round)
            return EXIT_OK
        except RunChangedError as exc:
            message = f"the experiment was reset while this worker ran ({exc}): restart this worker"
            self.log.event("worker_gave_up", message, level="error")
            logger.error("%s", message)
            return EXIT_GAVE_UP
        except GiveUpError as exc:
            logger.error("%s", exc)
            # A silent coordinator: the training since the last checkpoint is kept (not so for no room: a
            # StorageFullError; a twin or a reset experiment are not GiveUpErrors)
            saved = self._checkpoint_on_stop() if isinstance(exc, CoordinatorSilentError) else ""
            self.log.event("worker_gave_up", f"{exc}{saved}", level="error")
            return EXIT_GAVE_UP
        finally:
            if self.heartbeat is not None:  # one that stepped down leaves the peer file to the other process
                self.heartbeat.stop(mark_stopped=self._twin is None)
            self.log.flush()
            self.tracking.close()
            self.exchange.close()
            self.workload.close()

    def _checkpoint_on_stop(self) -> str:
        """Before a stopped worker exits: the workload checkpoints the last round it trained, unless its latest
        checkpoint holds it or is younger than STOP_CHECKPOINT_MIN_SECONDS; a phrase saying what it saved.

        Not after a round trained in part (a stop between stages, NUM_STAGES > 1): the model then holds that round's
        first stages on top of the last whole round, which no checkpoint can bear (one of round R would skip R's
        other stages on resume, one of R - 1 would replay its first ones); the latest checkpoint is kept.
        """
        if self._part_played is not None:
            round_, stages = self._part_played
            reason = (
                f"round {round_} was trained in part, {stages} of {self.config.num_stages} stages, which no checkpoint "
                "can hold: the worker resumes from its latest checkpoint"
            )
            logger.warning("stopping without a stop checkpoint: %s", reason)
            return f", without a stop checkpoint ({reason})"
        try:
            saved = self.workload.checkpoint_on_stop()
        except GiveUpError as exc:  # no room for it (a StorageFullError): the stop goes on, and says why
            logger.error("%s", exc)
            return f", without a stop checkpoint ({exc})"
        except OSError as exc:  # a failed write (a StorageError too): the stop goes on, and says why
            logger.error("stop checkpoint not saved: %s: %s", type(exc).__name__, exc)
            return f", without a stop checkpoint ({type(exc).__name__}: {exc})"
        if saved is None:
            return ""
        self.log.event(
            "checkpoint_on_stop",
            f"saved a checkpoint of round {saved} before stopping",
            round_=saved,
            checkpoint_round=saved,
        )
        return f", its training kept in a checkpoint of round {saved}"

    def _join(self) -> str:
        """Wait for the experiment to exist (one its pinned coordinator key signed, §5.5), learn its run id and pin
        its key, clean up after a killed predecessor."""
        local = self.identity.read_local()
        refused: str | None = None  # why the last experiment.json seen could not be joined

        def joinable() -> ExperimentRecord | None:
            nonlocal refused
            experiment = self.exchange.read_experiment()
            why = None if experiment is None else pin_verdict(local, experiment, self.config.repin_coordinator_key)
            if why is not None:
                if refused != why:
                    self._rejected(self.layout.experiment_file, why)
                    logger.warning("rejected %s: %s", self.layout.experiment_file, why)
                refused = why
                return None
            return experiment

        experiment = joinable()
        if experiment is None:
            logger.info(
                "no experiment %r yet: waiting up to %g s for its coordinator (COORDINATOR_WAIT_TIMEOUT)",
                self.config.experiment_name,
                self.config.coordinator_wait_timeout,
            )
            experiment = wait_for(joinable, self.stop, self.config.coordinator_wait_timeout, self._state_backoff)
        if experiment is None and refused is not None:
            raise GiveUpError(
                f"experiment {self.config.experiment_name!r}: for {self.config.coordinator_wait_timeout:g} s "
                f"(COORDINATOR_WAIT_TIMEOUT) there was no experiment.json this worker may join: {refused}"
            )
        if experiment is None:
            raise GiveUpError(
                f"no experiment {self.config.experiment_name!r} appeared in {self.config.coordinator_wait_timeout:g} s:"
                " start the coordinator with the same GDRIVE_PATH and EXPERIMENT_NAME"
            )
        self.exchange.run_id = experiment.run_id
        self.experiment = experiment
        self._refuse_other_settings(experiment.config)
        if experiment.public_key is not None and local.get("coordinator_key") != experiment.public_key:
            logger.info("pinned coordinator key %s of experiment %s", short(experiment.public_key), experiment.run_id)
        new_run = {"last_round": None} if local.get("run_id") != experiment.run_id else {}  # nothing played of it
        self.identity.write_local(**pin_of(experiment), **new_run)  # the pin holds the run id
        self._own_temp_cleanup(self._local_last_round())
        return experiment.run_id

    def _local_last_round(self) -> int | None:
        """The last round completed by this node, from its local record; None if absent or not a round."""
        last = self.identity.read_local().get("last_round")
        if last is None or (type(last) is int and 0 <= last <= 10**9):  # records.Round's range
            return last
        logger.warning("ignoring last_round %r in %s: not a round number", last, self.identity.path)
        return None

    def _on_twin(self, message: str, step_down: bool) -> None:
        """The heartbeat saw another live process writing this node's peer file (called from its thread)."""
        self.log.event("node_id_conflict", message, level="error")
        if step_down:
            self._twin = message
            self.stop.set()

    def _refuse_other_settings(self, experiment_config: dict) -> None:
        """Refuse to join an experiment defined with other settings: its groups, rewards and model would
        not be comparable with the other workers' (the coordinator wrote them into experiment.json)."""
        rows = [row for row in self.config.differing_fields(experiment_config) if row[0] != "experiment_name"]
        if not rows:
            return
        differing = [k for k, _, _ in rows]
        shown = ", ".join(f"{k.upper()}={mine!r} (experiment: {theirs!r})" for k, mine, theirs in rows)
        fixes = ["set the experiment's values on this worker"]
        if "dataset_rows_hash" in differing:
            fixes.append("use the same copy of the dataset as the coordinator (DATASET_PATH)")
        if "chat_template_sha256" in differing:
            fixes.append("use the coordinator's CHAT_TEMPLATE file")
        message = (
            f"this worker's settings differ from experiment {self.config.experiment_name!r}'s, which its "
            f"coordinator defined: {shown}: {'; '.join(fixes)} (or join another EXPERIMENT_NAME)"
        )
        self.log.event("worker_refused", message, level="error", differing=[k.upper() for k in differing])
        raise ExperimentMismatchError(message)

    def _own_temp_cleanup(self, last_round: int | None) -> None:
        paths = [
            self.layout.peer_file(self.node_id),
            self.layout.metrics_file(self.node_id),
            self.layout.events_file(self.node_id),
        ]
        for round_ in (0,) if last_round is None else (last_round, last_round + 1):
            for stage in range(self.config.num_stages):
                paths.append(self.layout.rollout_file(round_, stage, self.node_id))
                paths.append(self.layout.reward_file(round_, stage, self.node_id))
        removed = self.exchange.remove_own_temporaries(paths)
        if removed:
            self.log.event("temporaries_removed", f"{removed} left by an earlier process", count=removed)

    # -- rounds ----------------------------------------------------------------------------

    def _next_state(self, target: int) -> StateRecord:
        """The trusted state (§5.5) once it reaches ``target`` or finishes, or once it has stayed behind this
        worker's progress (``self.states.overdue``)."""
        assert self.states is not None

        def ready() -> StateRecord | None:
            state = self.states.read(target)
            if state is not None and self.states.overdue:
                return state
            if state is None:
                return None
            if state.status == "running" and state.mode == "async":  # no round to wait for: the worker's own
                self._followed = True
                return state
            if state.status == "stopped":
                return state if self._followed else self._await_restart(state)
            self._followed = True  # this process has seen the coordinator at work (waiting for workers too)
            if state.status == "waiting":
                return None
            return state if state.status == "finished" or state.round >= target else None

        self._state_pacer.expect(*(self.rounds.next_open() or (None, 0.0)))
        state = wait_for(ready, self.stop, self.config.coordinator_wait_timeout, self._state_pacer)
        if state is not None and state.status == "running":
            self.rounds.opened(state.round, time.monotonic(), state.round_opened_at)
        if state is None:
            trusted = self.states.trusted
            if trusted is not None and trusted.status == "stopped":
                raise CoordinatorSilentError(
                    f"coordinator {trusted.coordinator_id} stayed stopped for {self.config.coordinator_wait_timeout:g}"
                    " s (COORDINATOR_WAIT_TIMEOUT): start it again (same GDRIVE_PATH and EXPERIMENT_NAME), then this "
                    "worker"
                )
            raise CoordinatorSilentError(
                f"the round state did not reach round {target} in {self.config.coordinator_wait_timeout:g} s:"
                " is the coordinator running? (raise COORDINATOR_WAIT_TIMEOUT to wait longer)"
            )
        return state

    def _await_restart(self, state: StateRecord) -> None:
        """A worker that starts while its coordinator is stopped waits for it (the user may be restarting the
        swarm in any order), and says so once."""
        if self._said_stopped != state.seq:
            self._said_stopped = state.seq
            logger.warning(
                "coordinator %s is stopped (at round %d, %.0f s ago): waiting up to %g s (COORDINATOR_WAIT_TIMEOUT) "
                "for it to be started again",
                state.coordinator_id,
                state.round,
                max(0.0, time.time() - state.updated_at),
                self.config.coordinator_wait_timeout,
            )
        return None

    def _rounds(self) -> None:
        last = self._local_last_round()
        restored = self.workload.resume()
        if restored is not None:
            self.log.event(
                "resumed_from_checkpoint",
                f"model, optimizer and RNG of round {restored}",
                round_=restored,
                checkpoint_round=restored,
                params=self.workload.restored_digest,
            )
            last = restored
        elif last is not None and not self.workload.stateless:
            self.log.event(
                "resumed_without_checkpoint",
                f"no checkpoint of this node: rounds up to {last} are "
                "not in the model, which starts again from MODEL_NAME",
                level="warning",
                round_=last,
            )
        assert self.experiment is not None
        self.states = StateFollower(
            self.exchange,
            self.experiment,
            last,
            CONFIRM_SECONDS + self.config.sync_lag,
            on_reject=self._rejected,
            key=self.experiment.public_key,
            # past the coordinator's read-back of both files (every HEARTBEAT_INTERVAL), which reverts a forgery
            run_change_s=CONFIRM_SECONDS + self.config.sync_lag + 2 * self.config.heartbeat_interval,
        )
        target = 0 if last is None else last + 1
        while True:
            state = self._next_state(target)
            self._note_mode(state)
            if state.status == "running" and state.mode == "async":
                self._async_rounds(state, last)
                return
            if self.states.overdue:
                target = self._reconcile(state, target)
                last = target - 1 if target else None
                continue
            if state.status == "stopped":
                raise CoordinatorStoppedError(state)
            if state.status == "finished":
                self.log.event("experiment_finished", f"finished after {state.round} rounds", round_=state.round)
                if target < state.max_rounds:  # it ended while this worker was away (async: without waiting for it)
                    last_round = state.max_rounds - 1
                    message = f"the experiment finished before rounds {target}..{last_round} of this worker"
                    self._skipped(state, target, last_round, message)
                self._final_end(last, state.run_id)
                return
            if state.round > target:
                self._skipped(state, target, state.round - 1, f"behind: skipping rounds {target}..{state.round - 1}")
            self.run_round(state)
            last = state.round
            target = state.round + 1

    def _skipped(self, state: StateRecord, first: int, last: int, message: str) -> None:
        """``round_skipped``: rounds ``first``..``last`` of this worker that it will never play."""
        self.log.event("round_skipped", message, round_=state.round, skipped_from=first, skipped_to=last)

    def _note_mode(self, state: StateRecord) -> None:
        """Say once, at INFO, that this worker's ROUND_MODE is not the experiment's: it follows the experiment's."""
        if self._mode_noted or state.status != "running" or self.config.round_mode in (state.mode, "auto"):
            return
        self._mode_noted = True
        logger.info(
            "experiment %s plays %s rounds (its coordinator's ROUND_MODE): so does this worker; its own "
            "ROUND_MODE=%s applies only where it is the coordinator",
            self.config.experiment_name,
            "asynchronous" if state.mode == "async" else "synchronous",
            self.config.round_mode,
        )

    def _final_end(self, last: int | None, run_id: str) -> None:
        """After this worker's last round: the final policy's held-out evaluation (EVAL_INTERVAL > 0) and the
        workload's final end of round (its last checkpoint), when it played a round."""
        if last is None:
            return
        if self.config.eval_interval:  # the policy after the last round
            self.evaluate(last + 1, run_id)
        final = self.workload.end_round(last, final=True)
        if final:
            self.log.metric(final, round_=last)

    # -- asynchronous rounds ---------------------------------------------------------------

    def _async_rounds(self, state: StateRecord, last: int | None) -> None:
        """Play this worker's own rounds back to back, from ``last`` + 1 up to the state's ``max_rounds`` - 1,
        never waiting on another node (ROUND_MODE=async).

        The state is read between rounds, at most every POLL_INTERVAL_MAX seconds and without waiting: through the
        same trust rule as in the synchronous mode (§5.5), ``finished`` ends the worker as there, ``stopped`` is the
        coordinator's stop and a reset a :class:`RunChangedError`. Its own last round played, the worker ends as on
        ``finished``; the coordinator then marks the experiment finished once every worker has.
        """
        self._pickup = Pickup(
            self.exchange,
            self.config.sapo_max_peers,
            self.config.num_transplant_trees,
            self.workload.rescore,
            self.log.event,
            self.config.max_staleness_seconds,
            self.config.max_staleness_rounds,
            self.config.liveness_timeout,
            peers_reuse_s=min(PEERS_REUSE_S, self.config.heartbeat_interval),
        )
        round_ = 0 if last is None else last + 1
        read_at = time.monotonic()
        while True:
            if round_ >= state.max_rounds:
                self.log.event(
                    "rounds_completed",
                    f"played its rounds up to {state.max_rounds - 1} (MAX_ROUNDS={state.max_rounds})",
                    round_=state.max_rounds - 1,
                    max_rounds=state.max_rounds,
                )
                self._final_end(last, state.run_id)
                return
            if self.stop.is_set():
                raise Stopped()
            self._pickup.round_started()
            self.run_round(state.model_copy(update={"round": round_}))
            last, round_ = round_, round_ + 1
            if time.monotonic() - read_at >= self.config.poll_interval_max:
                read_at = time.monotonic()
                state = self._async_state(state)
                if state.status == "finished":
                    self.log.event("experiment_finished", "the coordinator finished the experiment", round_=last)
                    self._final_end(last, state.run_id)
                    return

    def _async_state(self, state: StateRecord) -> StateRecord:
        """The trusted state now, without waiting (``state`` when none is readable); raises
        :class:`CoordinatorStoppedError` on ``stopped``."""
        assert self.states is not None
        try:
            trusted = self.states.read(0)  # target 0: a worker ahead of the state's round is not behind it here
        except StorageUnavailableError as exc:  # the store is down for now: play on, read it again later
            logger.warning("storage unavailable while reading the state (%s); will try again", exc)
            return state
        if trusted is None or trusted.status in ("waiting", "running"):
            return state if trusted is None else state.model_copy(update={"max_rounds": trusted.max_rounds})
        if trusted.status == "stopped":
            raise CoordinatorStoppedError(trusted)
        return trusted

    def _reconcile(self, state: StateRecord, target: int) -> int:
        """This worker's progress is ahead of the coordinator's state for good (§5.5): the round to play next."""
        assert self.states is not None
        new = self.states.next_target(state, target)
        self.log.event(
            "progress_reconciled",
            f"the coordinator's state stayed at round {state.round}, behind this worker's round {target} (a forged "
            f"state played, a poisoned local record, or a coordinator that went back): on with round {new}",
            level="warning",
            round_=state.round,
            from_round=target,
            to_round=new,
        )
        self.identity.write_local(last_round=new - 1 if new else None)
        return new

    def run_round(self, state: StateRecord) -> None:
        """All stages of ``state.round``, then metrics, retention and the local progress mark."""
        round_ = state.round
        logctx.set_round(round_)
        self.log.round = round_
        assert self.heartbeat is not None
        self.heartbeat.set_round(round_)
        started = time.monotonic()
        calls_before = dict(self.exchange.stats)
        backend = getattr(self.exchange.storage, "counters", None)  # a remote backend's API calls and bytes
        if self._evaluates_before(round_):
            self.evaluate(round_, state.run_id)
        buffered: list[RolloutBatch] = []
        self.exchange.prefetch_round(round_, state.num_stages)
        for stage in range(state.num_stages):
            if stage and self.stop.is_set():
                raise Stopped()
            ctx = StageContext(self.node_id, round_, stage, self.config.seed)
            self._stage(ctx, state, buffered)
        if self.config.rollout_cleanup_enabled:
            removed = self.exchange.cleanup_rollouts(
                round_,
                self.config.rollout_keep_last_n_rounds,
                self.config.rollout_archive_old,
                retention_seconds(state.mode, self.config.max_staleness_seconds, self.config.sync_lag),
            )
            if removed:
                self.log.event(
                    "rollouts_cleaned",
                    f"{removed} old rollout files " + ("archived" if self.config.rollout_archive_old else "deleted"),
                    count=removed,
                )
        after = self.workload.end_round(round_, final=False)
        self._part_played = None  # the round is whole: a stop now checkpoints it
        stats = {f"storage/{k}": v - calls_before[k] for k, v in self.exchange.stats.items()}
        if backend is not None:  # everything since the previous round's line: state polls and log flushes too
            stats.update({f"storage/backend_{k}": v - self._backend_mark.get(k, 0) for k, v in backend.items()})
            self._backend_mark = dict(backend)
        seconds = time.monotonic() - started
        self.log.metric({"round/seconds": seconds, **stats, **after})
        self.log.flush()
        self._round_seconds = [*self._round_seconds[-4:], seconds]
        logger.info("%s", progress.round_line(round_, state.max_rounds, self._reward, seconds, self._round_seconds))
        self.identity.write_local(last_round=round_)

    def _evaluates_before(self, round_: int) -> bool:
        """Held-out evaluation before rounds 0, N, 2N, ... (N = EVAL_INTERVAL); before round 0 only with
        EVAL_BEFORE_TRAINING."""
        every = self.config.eval_interval
        return bool(every) and round_ % every == 0 and (round_ > 0 or self.config.eval_before_training)

    def evaluate(self, round_: int, run_id: str) -> None:
        """Held-out evaluation before round ``round_``: metrics, and an eval record in the shared folder."""
        started = time.monotonic()
        results = self.workload.evaluate(round_)
        if not results:
            return
        self.exchange.write_eval(
            EvalRecord(node_id=self.node_id, run_id=run_id, round=round_, results=results, created_at=time.time())
        )
        base = [r for r in results if r.level == 0]
        values: dict[str, float | int | None] = {f"eval/{r.task}/pass1": r.pass1 for r in base}
        values.update({f"eval/{r.task}/pass1_se": r.pass1_se for r in base})
        values.update({f"eval/{r.task}/level": r.level for r in results if r.level > 0})
        values.update({f"eval/{r.task}/level_pass1": r.pass1 for r in results if r.level > 0})
        values.update({f"eval/{r.task}/pass_at_{r.k}": r.pass_k for r in base if r.pass_k is not None})
        values["eval/pass1"] = sum(r.pass1 for r in base) / len(base)
        # The tasks' held-out sets are independent samples: the SE of their mean adds in quadrature.
        values["eval/pass1_se"] = math.sqrt(sum((r.pass1_se or 0.0) ** 2 for r in base)) / len(base)
        values["eval/seconds"] = time.monotonic() - started
        self.log.metric(values, round_=round_)
        logger.info(
            "held-out pass@1 before round %d: %.3f ± %.3f (%s)",
            round_,
            values["eval/pass1"],
            values["eval/pass1_se"],
            ", ".join(f"{r.task} {r.pass1:.2f} ± {r.pass1_se or 0.0:.2f} of {r.n}" for r in base),
        )

    def _stage(self, ctx: StageContext, state: StateRecord, buffered: list[RolloutBatch]) -> None:
        """One stage: generate and publish, select the external groups, train on I + J, submit the reward."""
        t0 = time.monotonic()
        local = self._generate_and_publish(ctx, state, buffered)
        generated = time.monotonic()
        if self._pickup is None:
            gathered, selection = self._select_externals(ctx, state)
            extra = {}
        else:
            gathered, selection, extra = self._pick_up_externals(ctx)
        gathered_at = time.monotonic()
        if self.stop.is_set():  # before the update: at stage 0 the model is the last whole round's, which a stop
            raise Stopped()  # checkpoints; at a later stage it holds part of this round, and no checkpoint is saved
        train_metrics = self.workload.train(ctx, local, list(selection.chosen))
        self._part_played = (ctx.round, ctx.stage + 1)
        # A stop during the update: the stage is submitted (and a last stage's round ended) before the node stops.
        reward = self._reward = self._submit(ctx, state, local, selection)
        j = self.config.num_transplant_trees
        self.log.metric(
            {
                "stage": ctx.stage,
                "reward/local_mean": reward,
                "swarm/local_groups": len(local),
                "swarm/external_requested": j,
                "swarm/external_used": len(selection.chosen),
                "swarm/external_offered": selection.offered,
                "swarm/external_zero_variance": selection.zero_variance_dropped,
                "swarm/external_dropped_invalid": gathered.dropped,
                "swarm/peers_read": len(gathered.batches),
                "time/generate_s": generated - t0,
                "time/gather_s": gathered_at - generated,
                "time/train_s": time.monotonic() - gathered_at,
                **extra,
                **train_metrics,
            }
        )
        logger.info(
            "stage %d: reward %.3f, %d local + %d external groups from %d peers",
            ctx.stage,
            reward,
            len(local),
            len(selection.chosen),
            len(gathered.batches),
        )

    def _generate_and_publish(
        self, ctx: StageContext, state: StateRecord, buffered: list[RolloutBatch]
    ) -> list[ScoredGroup]:
        """This node's groups of the stage, written as rollouts per ROLLOUT_PUBLISH_FREQUENCY."""
        groups: list[RolloutGroup] = []
        frequency = self.config.rollout_publish_frequency
        for group in self.workload.generate(ctx):
            groups.append(group)
            if frequency == "generation":
                self.exchange.write_rollouts(self._batch(ctx, groups, complete=False))
            if self.stop.is_set():
                raise Stopped()
        batch = self._batch(ctx, groups, complete=True)
        if frequency != "round":
            self.exchange.write_rollouts(batch)
        else:  # every stage's batch is written once the last stage has generated, before it gathers
            buffered.append(batch)
            if ctx.stage == state.num_stages - 1:
                for held in buffered:
                    self.exchange.write_rollouts(held)
        return [ScoredGroup(self.node_id, g, tuple(g.rewards)) for g in groups]

    def _select_externals(self, ctx: StageContext, state: StateRecord) -> tuple[Gathered, Selection]:
        """Gather the peers' groups of the stage (J > 0) and pick J of them (SAPO); a shortfall is an event."""
        j = self.config.num_transplant_trees
        gathered = Gathered()
        if j:
            gather = PeerGather(
                self.exchange,
                ctx,
                state.live_workers,
                self.config.sapo_max_peers,
                j,
                self.workload.rescore,
                self.log.event,
                groups_per_peer=self.config.num_train_samples,
            )
            gathered = gather.run(self.stop, self.config.rollout_wait_timeout, self._gather_backoff)
        selection = gathered.select(j, ctx)
        self._say_shortfall(j, selection)
        return gathered, selection

    def _say_shortfall(self, j: int, selection: Selection) -> None:
        """Fewer than J external groups were found for the stage: an ``external_shortfall`` event."""
        if selection.shortfall:
            self.log.event(
                "external_shortfall",
                f"wanted {j} external groups, got {len(selection.chosen)}",
                level="warning",
                requested=j,
                used=len(selection.chosen),
                offered=selection.offered,
            )

    def _pick_up_externals(self, ctx: StageContext) -> tuple[Gathered, Selection, dict[str, float | int | None]]:
        """An asynchronous stage's J external groups (:class:`Pickup`, never waiting), each one recorded in an
        ``externals_taken`` event; a shortfall is an event as in the synchronous mode. Also the stage's staleness
        metrics."""
        assert self._pickup is not None
        j = self.config.num_transplant_trees
        if not j:
            selection = Gathered().select(0, ctx)
            return Gathered(), selection, {}
        picked = self._pickup.run(ctx)
        selection = picked.selection
        if picked.taken:
            self.log.event(
                "externals_taken",
                f"{len(picked.taken)} external groups: "
                + ", ".join(f"{t.source} round {t.source_round} ({t.age_s:.1f} s old)" for t in picked.taken),
                **picked.event_data(),
            )
        self._say_shortfall(j, selection)
        return picked.gathered, selection, picked.metrics()

    def _submit(self, ctx: StageContext, state: StateRecord, local: list[ScoredGroup], selection: Selection) -> float:
        """Write this stage's reward record (the mean reward of the local completions); returns that reward."""
        local_rewards = [r for g in local for r in g.rewards]
        reward = sum(local_rewards) / len(local_rewards) if local_rewards else 0.0
        self.exchange.write_reward(
            RewardRecord(
                node_id=self.node_id,
                run_id=state.run_id,
                round=ctx.round,
                stage=ctx.stage,
                reward=reward,
                num_local_groups=len(local),
                num_external_groups=len(selection.chosen),
                external_requested=self.config.num_transplant_trees,
                submitted_at=time.time(),
            )
        )
        return reward

    def _batch(self, ctx: StageContext, groups: list[RolloutGroup], complete: bool) -> RolloutBatch:
        return RolloutBatch(
            node_id=self.node_id,
            run_id=self.exchange.run_id or "",
            round=ctx.round,
            stage=ctx.stage,
            groups=list(groups),
            complete=complete,
            created_at=time.time(),
        )
