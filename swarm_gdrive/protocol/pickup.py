"""The asynchronous worker's SAPO pickup (ROUND_MODE=async): J external groups from what it can already see.

A worker that plays its own rounds back to back never waits for a peer. At each stage a :class:`Pickup` looks at
the live workers other than itself (their peer files, listed at most every :data:`PEERS_REUSE_S` seconds), in an
order drawn by ``rng_for(SEED, node, round, stage, purpose="pickup")``, at most SAPO_MAX_PEERS of them (0: all).
For each it reads the freshest complete batch of the stage it can see: the peer's current round (its peer record's
``round``), else the round before, within the same read caps as the synchronous gather (:data:`MAX_GATHER_FILES`,
:data:`MAX_GATHER_BYTES`). A batch older than MAX_STALENESS_SECONDS, or created before more than
MAX_STALENESS_ROUNDS of this worker's own rounds started, is passed over. Every group is re-scored from its
provenance (:func:`~swarm_gdrive.protocol.gather.score_batch`); a group already trained on, identified by (source,
source round, stage, group id), is never taken again. Reading stops once J useful groups (reward variance) are in
hand, and J are sampled uniformly from the useful ones read (:func:`~swarm_gdrive.protocol.sapo.select_external`).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from swarm_gdrive.protocol.coordinator import Liveness
from swarm_gdrive.protocol.exchange import OVER_BUDGET, Exchange, ReadBudget, listing_key
from swarm_gdrive.protocol.gather import (
    MAX_GATHER_BYTES,
    MAX_GATHER_FILES,
    EventSink,
    Gathered,
    Rescore,
    Verdicts,
    say_budget_spent,
    score_batch,
)
from swarm_gdrive.protocol.records import PeerRecord, RolloutBatch
from swarm_gdrive.protocol.sapo import Selection, rng_for, select_external
from swarm_gdrive.protocol.workload import StageContext
from swarm_gdrive.storage.base import StorageUnavailableError

logger = logging.getLogger(__name__)

#: Longest the list of live peers and their rounds is reused: a fast worker plays many rounds a second, and a
#: listing of ``peers/`` per round (a request on Drive, N downloads of changed files) would cost more than its
#: rounds. A peer's record says its round only at each of its heartbeats anyway.
PEERS_REUSE_S = 5.0
#: This worker's round starts remembered for the staleness in rounds: a batch older than that many of its rounds
#: is counted that stale (MAX_STALENESS_ROUNDS is capped accordingly in effect).
ROUND_STARTS_KEPT = 10_000

#: (source node, source round, stage, group id): a group trained on once, never taken again.
GroupKey = tuple[str, int, int, str]


@dataclass(frozen=True)
class Taken:
    """One external group trained on, with how stale it was when it was taken."""

    source: str
    source_round: int
    stage: int
    group_id: str
    age_s: float
    staleness_rounds: int


@dataclass
class PickedUp:
    """What one stage's pickup read and chose."""

    gathered: Gathered
    selection: Selection
    taken: list[Taken] = field(default_factory=list)
    stale_skipped: int = 0  # batches passed over for their age (seconds or rounds)

    def metrics(self) -> dict[str, float | int | None]:
        """The stage metrics of the asynchronous mode (the age and staleness keys only when a group was taken)."""
        values: dict[str, float | int | None] = {"swarm/external_stale_skipped": self.stale_skipped}
        if self.taken:
            ages = [t.age_s for t in self.taken]
            rounds = [t.staleness_rounds for t in self.taken]
            values["swarm/external_age_s_mean"] = sum(ages) / len(ages)
            values["swarm/external_age_s_max"] = max(ages)
            values["swarm/external_staleness_rounds_mean"] = sum(rounds) / len(rounds)
            values["swarm/external_staleness_rounds_max"] = max(rounds)
        return values

    def event_data(self) -> dict[str, list[str | int | float]]:
        """The ``externals_taken`` event's data, one list per field (an event's data holds lists of scalars), the
        i-th entry of each list describing the i-th group taken."""
        return {
            "sources": [t.source for t in self.taken],
            "source_rounds": [t.source_round for t in self.taken],
            "stages": [t.stage for t in self.taken],
            "group_ids": [t.group_id for t in self.taken],
            "age_s": [round(t.age_s, 3) for t in self.taken],
            "staleness_rounds": [t.staleness_rounds for t in self.taken],
        }


class Pickup:
    """One asynchronous worker's pickups, stage after stage: it remembers the groups taken, its own round starts and
    the live peers."""

    def __init__(
        self,
        exchange: Exchange,
        max_peers: int,
        wanted: int,
        rescore: Rescore,
        event: EventSink,
        max_age_s: float,
        max_stale_rounds: int,
        liveness_timeout: float,
        peers_reuse_s: float = PEERS_REUSE_S,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``max_age_s``, ``max_stale_rounds``: MAX_STALENESS_SECONDS and MAX_STALENESS_ROUNDS (0: no bound)."""
        self.exchange, self.max_peers, self.wanted, self.rescore, self.event = (
            exchange,
            max_peers,
            wanted,
            rescore,
            event,
        )
        self.max_age_s, self.max_stale_rounds = max_age_s, max_stale_rounds
        self.peers_reuse_s = peers_reuse_s
        self.clock, self.monotonic = clock, monotonic
        self.liveness = Liveness(liveness_timeout)
        self.taken: set[GroupKey] = set()
        self._starts: list[float] = []  # this worker's round starts, wall clock, oldest first
        self._peers: dict[str, int] = {}  # live peer -> the round its record says it plays
        self._peers_read_at: float | None = None
        self._held: set[tuple[str, int, int]] = set()  # (source, round, stage) of the batches read and kept
        self._verdicts: dict[tuple[str, int, int], Verdicts] = {}  # by (source, round, stage): groups' re-scores

    # -- this worker's rounds ----------------------------------------------------------------

    def round_started(self, at: float | None = None) -> None:
        """This worker starts one of its rounds (``at``: wall time, now by default)."""
        self._starts.append(self.clock() if at is None else at)
        if len(self._starts) > ROUND_STARTS_KEPT:
            del self._starts[: len(self._starts) - ROUND_STARTS_KEPT]

    def staleness_rounds(self, created_at: float) -> int:
        """How many of this worker's rounds have started since ``created_at`` (the writer's clock, so as exact as
        the two machines' clocks agree): 0 for a batch created during this worker's current round."""
        return len(self._starts) - bisect.bisect_right(self._starts, created_at)

    def age_s(self, created_at: float, now: float) -> float:
        """Seconds since ``created_at``, by this node's clock against the writer's, at least 0: the clocks of two
        machines may disagree by seconds (or more, unsynchronised), so a batch can look younger or older than it is,
        and one from a clock ahead of this one would look as if created in the future."""
        return max(0.0, now - created_at)

    def too_stale(self, age_s: float, staleness_rounds: int) -> bool:
        """Whether a batch of that age is beyond MAX_STALENESS_SECONDS or MAX_STALENESS_ROUNDS (0: no bound)."""
        if self.max_age_s and age_s > self.max_age_s:
            return True
        return bool(self.max_stale_rounds) and staleness_rounds > self.max_stale_rounds

    # -- the pickup --------------------------------------------------------------------------

    def run(self, ctx: StageContext) -> PickedUp:
        """This stage's external groups: at most J, never waiting; nothing read twice in one call."""
        rng = rng_for(ctx.seed, ctx.node_id, ctx.round, ctx.stage, purpose="pickup")
        try:
            peers = self.live_peers()
        except StorageUnavailableError as exc:  # the store is down for now: the peers last seen, or none
            logger.warning("storage unavailable while listing peers (%s); the pickup goes on without", exc)
            peers = self._peers
        order = sorted(peers)
        rng.shuffle(order)
        if self.max_peers:
            order = order[: self.max_peers]
        gathered = Gathered()
        budget = ReadBudget(MAX_GATHER_FILES, MAX_GATHER_BYTES)
        seen: dict[str, tuple[int, float, int]] = {}  # source -> (round, age, staleness) of the batch read
        useful = stale = 0
        now = self.clock()
        for peer in order:
            if useful >= self.wanted:
                break
            try:
                batch, spent = self._freshest(peer, peers[peer], ctx.stage, budget)
            except StorageUnavailableError as exc:  # never a crash mid-round: train on what is in hand
                logger.warning("storage unavailable while reading %s's rollouts (%s); the pickup stops here", peer, exc)
                break
            if spent:
                say_budget_spent(self.event, budget, order[order.index(peer) :], "a pickup")
                break
            if batch is None:
                continue
            age, rounds = self.age_s(batch.created_at, now), self.staleness_rounds(batch.created_at)
            if self.too_stale(age, rounds):
                stale += 1
                continue
            verdicts = self._verdicts.setdefault((peer, batch.round, batch.stage), {})
            scored, rejected = score_batch(ctx, peer, batch, self.rescore, self.event, verdicts)
            fresh = [g for g in scored if (peer, batch.round, batch.stage, g.group.group_id) not in self.taken]
            gathered.batches[peer] = batch
            gathered.scored[peer] = fresh
            gathered.dropped += rejected
            seen[peer] = (batch.round, age, rounds)
            useful += sum(g.has_variance for g in fresh)
        selection = select_external(gathered.pool(), self.wanted, rng)
        taken = []
        for group in selection.chosen:
            source_round, age, rounds = seen[group.source]
            self.taken.add((group.source, source_round, ctx.stage, group.group.group_id))
            taken.append(Taken(group.source, source_round, ctx.stage, group.group.group_id, age, rounds))
        self._forget_old(peers)
        return PickedUp(gathered, selection, taken, stale)

    def live_peers(self) -> dict[str, int]:
        """The live workers other than this one, each with the round its peer record says it plays (a worker that
        has not started a round yet is left out); listed again at most every ``peers_reuse_s`` seconds.

        Live as the coordinator judges it (:class:`~swarm_gdrive.protocol.coordinator.Liveness`): a worker peer
        file of this run that says ``alive`` and whose listing entry changed within LIVENESS_TIMEOUT, by this
        node's clock. Only registered workers are read: a batch of a name without such a peer file never is.
        """
        now = self.monotonic()
        if self._peers_read_at is not None and now - self._peers_read_at < self.peers_reuse_s:
            return self._peers
        self._peers_read_at = now
        peers: dict[str, int] = {}
        for node_id, seen in self.exchange.read_peers().items():
            record = seen.record
            if node_id == self.exchange.node_id or not isinstance(record, PeerRecord):
                continue
            if record.role != "worker" or record.status != "alive":
                self.liveness.forget(node_id)
                continue
            self.liveness.observe(node_id, listing_key(seen.info), now)
            if record.round is not None:
                peers[node_id] = record.round
        live = self.liveness.live(now)
        self._peers = {node: round_ for node, round_ in peers.items() if node in live}
        return self._peers

    def _freshest(self, peer: str, round_: int, stage: int, budget: ReadBudget) -> tuple[RolloutBatch | None, bool]:
        """The peer's complete batch of ``stage`` of ``round_``, else of ``round_ - 1``; (None, True) once the
        read budget is spent."""
        for candidate in (round_, round_ - 1):
            if candidate < 0:
                break
            skipped: dict[str, str] = {}
            batch = self.exchange.read_rollouts(
                candidate, stage, only={peer}, budget=budget, skipped=skipped, evict_older=False
            ).get(peer)
            if skipped.get(peer) == OVER_BUDGET:
                return None, True
            if batch is not None:
                self._held.add((peer, candidate, stage))
            if batch is not None and batch.complete:
                return batch, False
        return None, False

    def _forget_old(self, peers: dict[str, int]) -> None:
        """Let go of what no later pickup reads: each batch kept (and its re-scores) of a round before its peer's
        round - 1, and every one of a peer no longer live. Memory then holds about two batches a stage per live
        peer, however far apart the peers' rounds are."""
        for source, round_, stage in list(self._held):
            if round_ < peers.get(source, round_ + 2) - 1:
                self._held.discard((source, round_, stage))
                self._verdicts.pop((source, round_, stage), None)
                self.exchange.forget_rollout_file(round_, stage, source)
