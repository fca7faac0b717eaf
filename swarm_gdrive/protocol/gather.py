"""Gathering other nodes' rollouts of one stage for SAPO: which peers to read, re-scoring their groups locally,
and when to stop waiting.

A :class:`PeerGather` is made for one stage and polled until every expected peer's batch is complete (and,
with a peer cap, offers enough groups with reward variance) or ROLLOUT_WAIT_TIMEOUT runs out. It reads only
the batches of registered workers (a peer file of a worker of this run; the state's live workers are), and at
most :data:`MAX_GATHER_FILES` files and :data:`MAX_GATHER_BYTES` bytes per stage.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from swarm_gdrive.protocol.exchange import NOT_ASKED, OVER_BUDGET, Exchange, ReadBudget
from swarm_gdrive.protocol.polling import Backoff, wait_for
from swarm_gdrive.protocol.records import RolloutBatch, RolloutGroup
from swarm_gdrive.protocol.sapo import ScoredGroup, Selection, rng_for, select_external, select_in_order
from swarm_gdrive.protocol.workload import StageContext

#: Re-scores another node's group from its provenance (``Workload.rescore``); None drops it.
Rescore = Callable[[StageContext, RolloutGroup], "tuple[float, ...] | None"]
#: Records an event of the node's log: ``(event, message, level, **data)``.
EventSink = Callable[..., None]

#: The most distinct rollout files one stage's gather reads (with SAPO_MAX_PEERS=0, a swarm of more workers
#: is read up to this many peers, the state's live workers first).
MAX_GATHER_FILES = 256
#: The most bytes one stage's gather reads, re-reads of a re-published batch included: with the 32 MiB cap of
#: a batch, what a stage can hold in memory. Beyond it the gather goes on with what it has
#: (``gather_budget_spent``).
MAX_GATHER_BYTES = 128 * 2**20
#: Names listed in the ``rollouts_ignored`` event (the count has them all).
IGNORED_SHOWN = 10


@dataclass
class Gathered:
    """Other nodes' rollouts of one stage, re-scored locally, by source node.

    ``order``: with SAPO_MAX_PEERS > 0, the drawn order of every (peer, k) slot, the k-th group of a peer's batch
    in group id order (:meth:`slot`), of which :meth:`select` takes the first J useful ones. None: every peer was
    read, and the J are sampled from the whole pool."""

    batches: dict[str, RolloutBatch] = field(default_factory=dict)
    scored: dict[str, list[ScoredGroup]] = field(default_factory=dict)
    dropped: int = 0
    order: list[tuple[str, int]] | None = None

    def pool(self) -> list[ScoredGroup]:
        return [g for groups in self.scored.values() for g in groups]

    def slot(self, peer: str, k: int) -> ScoredGroup | None:
        """The k-th group (by group id) of ``peer``'s batch as re-scored here; None if absent or rejected."""
        batch = self.batches.get(peer)
        if batch is None or not 0 <= k < len(batch.groups):
            return None
        group_id = sorted(g.group_id for g in batch.groups)[k]
        return next((g for g in self.scored.get(peer, []) if g.group.group_id == group_id), None)

    def select(self, j: int, ctx: StageContext) -> Selection:
        """The J external groups (SAPO): the first useful slots of the drawn order when there is one, else a uniform
        sample of the whole pool seeded by (SEED, node, round, stage)."""
        if self.order is not None:
            return select_in_order(self.order, self.slot, self.pool(), j)
        return select_external(self.pool(), j, rng_for(ctx.seed, ctx.node_id, ctx.round, ctx.stage))

    def complete(self) -> set[str]:
        """Peers whose batch of the stage is complete."""
        return {node for node, batch in self.batches.items() if batch.complete}


class PeerGather:
    """Other nodes' rollouts of one stage, until the groups to sample from are read or time is up.

    With SAPO_MAX_PEERS = K > 0 and more live peers than K, every live peer's ``groups_per_peer`` (I) slots are put
    in one drawn order (seeded by SEED, node, round and stage), and only the peers that the first J slots with a
    useful group (one with reward variance) land on are read: about J peers, whatever the swarm's size, instead of
    all of them. The J chosen are then a uniform sample without replacement of the useful groups of all live peers,
    as in reading everyone and sampling (SAPO), as long as at most K peers are needed; beyond K peers the slots of
    unread peers are passed over. Otherwise (K = 0, or at most K peers) every live and registered peer is read and
    J are sampled from the whole pool.
    """

    def __init__(
        self,
        exchange: Exchange,
        ctx: StageContext,
        live_workers: list[str],
        max_peers: int,
        wanted: int,
        rescore: Rescore,
        event: EventSink,
        groups_per_peer: int = 1,
    ) -> None:
        self.exchange, self.ctx, self.wanted, self.rescore, self.event = exchange, ctx, wanted, rescore, event
        self.peers = sorted(set(live_workers) - {ctx.node_id})
        self.live = set(self.peers)
        self.cap = max_peers
        self.lazy = 0 < max_peers < len(self.peers)
        self.expected: set[str] = set() if self.lazy else set(self.peers)
        self.gathered = Gathered()
        self.budget = ReadBudget(MAX_GATHER_FILES, MAX_GATHER_BYTES)
        self.registered: set[str] | None = None  # workers with a peer file, read once a stranger's batch shows up
        self.ignored: set[str] = set()  # batches of names that never registered: never read
        self.over_budget: set[str] = set()
        # (node, group id) -> the group and its local re-score: a batch re-published after each generation
        # (ROLLOUT_PUBLISH_FREQUENCY=generation) re-scores, and rejects, only the groups that are new or changed.
        self._verdicts: dict[tuple[str, str], tuple[RolloutGroup, tuple[float, ...] | None]] = {}
        if self.lazy:
            slots = [(peer, k) for peer in self.peers for k in range(max(1, groups_per_peer))]
            rng_for(ctx.seed, ctx.node_id, ctx.round, ctx.stage, purpose="slots").shuffle(slots)
            self.gathered.order = slots
            self._settle()

    def run(self, stop: threading.Event, timeout: float, backoff: Backoff) -> Gathered:
        """Poll until done or ``timeout`` seconds have passed; say so (``rollout_wait_expired``) in the latter case."""
        try:
            if wait_for(self.poll, stop, timeout, backoff) is None:
                missing = sorted(self.expected - self.gathered.complete())
                self.event(
                    "rollout_wait_expired",
                    f"went on after {timeout:g} s without complete rollouts of {missing}",
                    level="warning",
                    missing=missing,
                )
        finally:
            self._report_ignored()
        return self.gathered

    def poll(self) -> bool | None:
        """Read what the expected peers published; True when done, None to poll again."""
        while True:
            skipped: dict[str, str] = {}
            batches = self.exchange.read_rollouts(
                self.ctx.round,
                self.ctx.stage,
                only=self._wanted(),
                budget=self.budget,
                skipped=skipped,
                first=self.live,
            )
            for node, batch in batches.items():
                if self.gathered.batches.get(node) is not batch:
                    self.gathered.batches[node] = batch
                    self.gathered.scored[node] = self._score(node, batch)
            if self._strangers({node for node, why in skipped.items() if why == NOT_ASKED}):
                return None  # a registered worker that is not in the state yet: read its batch at the next poll
            spent = {node for node, why in skipped.items() if why == OVER_BUDGET}
            if spent:
                self._budget_spent(spent)
                return True
            if not self.lazy:
                return True if self.expected <= self.gathered.complete() else None
            before = set(self.expected)
            if self._settle():
                return True
            if not (self.expected - before) & set(skipped):
                return None  # waiting for batches still being written
            # the draw moved on to peers whose batches were listed: read them now, not after a backoff

    def _settle(self) -> bool:
        """Walk the drawn slots: count the useful groups of the batches read, and expect the peers of the slots still
        needed (counted as if useful until read), up to K peers; True when nothing is pending: J useful groups are
        found, or no reachable slot is left."""
        assert self.gathered.order is not None
        complete = self.gathered.complete()
        found = pending = 0
        for peer, k in self.gathered.order:
            if found + pending >= self.wanted:
                break
            if peer in complete:
                group = self.gathered.slot(peer, k)
                found += group is not None and group.has_variance
            elif peer in self.expected or len(self.expected) < self.cap:
                self.expected.add(peer)
                pending += 1
        return pending == 0

    def _wanted(self) -> set[str]:
        """Whose batches to read: the expected peers with a cap; else the live and every registered worker."""
        if self.lazy:
            return self.expected
        return self.live | (self.registered or set())

    def _strangers(self, unasked: set[str]) -> bool:
        """Sort the names left unread that are not live peers into registered workers (read from the next poll
        on, without a cap) and never-registered ones (ignored); True if some registered worker was found."""
        strangers = unasked - self.live - self.ignored
        if not strangers:
            return False
        if self.registered is None:
            self.registered = self.exchange.registered_workers() - {self.ctx.node_id}
        self.ignored |= strangers - self.registered
        return not self.lazy and bool(strangers & self.registered)

    def _budget_spent(self, unread: set[str]) -> None:
        if self.over_budget:
            return
        self.over_budget = unread
        say_budget_spent(self.event, self.budget, sorted(unread), "a gather")

    def _report_ignored(self) -> None:
        if not self.ignored:
            return
        shown = sorted(self.ignored)[:IGNORED_SHOWN]
        self.event(
            "rollouts_ignored",
            f"ignored {len(self.ignored)} rollout file(s) of names that never registered as a worker of this run "
            f"(no valid peers/{{name}}.json): {', '.join(shown)}" + (" ..." if len(self.ignored) > len(shown) else ""),
            level="warning",
            names=shown,
            count=len(self.ignored),
        )

    def _score(self, node: str, batch: RolloutBatch) -> list[ScoredGroup]:
        """The batch's groups with this node's own rewards; a group whose provenance fails is dropped and logged."""
        scored, rejected = score_batch(self.ctx, node, batch, self.rescore, self.event, self._verdicts)
        self.gathered.dropped += rejected
        return scored


def say_budget_spent(event: EventSink, budget: ReadBudget, unread: list[str], reader: str) -> None:
    """The ``gather_budget_spent`` warning: ``budget`` is spent and the batches of ``unread`` were left unread."""
    event(
        "gather_budget_spent",
        f"read {len(budget.paths)} rollout files ({(MAX_GATHER_BYTES - budget.bytes) / 2**20:.1f} MiB) this stage, "
        f"the most {reader} reads (MAX_GATHER_FILES={MAX_GATHER_FILES}, MAX_GATHER_BYTES={MAX_GATHER_BYTES}); "
        f"left unread: {', '.join(unread[:IGNORED_SHOWN])}" + (" ..." if len(unread) > IGNORED_SHOWN else ""),
        level="warning",
        unread=unread[:IGNORED_SHOWN],
        count=len(unread),
    )


#: (node, group id) -> a group as last read and its local re-score (None: rejected).
Verdicts = dict[tuple[str, str], tuple[RolloutGroup, tuple[float, ...] | None]]


def score_batch(
    ctx: StageContext, node: str, batch: RolloutBatch, rescore: Rescore, event: EventSink, verdicts: Verdicts
) -> tuple[list[ScoredGroup], int]:
    """``node``'s groups of ``batch`` with this node's own rewards, and how many were newly rejected.

    A group whose provenance fails is dropped and logged (``group_rejected``) once: ``verdicts`` remembers each
    group's re-score, so a batch read again (re-published after each generation, or taken from again by an
    asynchronous worker) re-scores, and rejects, only the groups that are new or changed.
    """
    scored = []
    rejected = 0
    for group in batch.groups:
        seen = verdicts.get((node, group.group_id))
        if seen is not None and seen[0] == group:
            rewards = seen[1]
        else:
            rewards = rescore(ctx, group)
            verdicts[(node, group.group_id)] = (group, rewards)
            if rewards is None:
                rejected += 1
                event(
                    "group_rejected",
                    f"{node}/{group.group_id}: provenance check failed",
                    level="warning",
                    source=node,
                    group_id=group.group_id,
                )
        if rewards is not None:
            scored.append(ScoredGroup(node, group, rewards))
    return scored, rejected
