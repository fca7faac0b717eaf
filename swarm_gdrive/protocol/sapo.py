"""SAPO's mixing of local and swarm rollouts (arXiv 2509.08721, section 3.2); pure functions.

A worker trains on its I local groups plus J groups sampled uniformly from the groups
other nodes shared this round, after dropping groups whose locally computed rewards are
all equal (they carry no GRPO advantage). The sampler is seeded by (SEED, node, round,
stage), so a run is reproducible and nodes sample independently.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from swarm_gdrive.protocol.records import RolloutGroup


@dataclass(frozen=True)
class ScoredGroup:
    """A group with rewards computed by *this* node (never the writer's claimed rewards)."""

    source: str
    group: RolloutGroup
    rewards: tuple[float, ...]

    @property
    def has_variance(self) -> bool:
        return len(self.rewards) > 1 and max(self.rewards) - min(self.rewards) > 1e-9


@dataclass(frozen=True)
class Selection:
    """The J external groups chosen, and what the choice had to work with."""

    chosen: tuple[ScoredGroup, ...]
    requested: int
    offered: int
    zero_variance_dropped: int

    @property
    def shortfall(self) -> int:
        return max(0, self.requested - len(self.chosen))


def select_in_order(
    order: Iterable[tuple[str, int]], slot: Callable[[str, int], ScoredGroup | None], pool: list[ScoredGroup], j: int
) -> Selection:
    """The first ``j`` slots of a drawn ``order`` of (peer, k) slots whose group (``slot``) exists and has reward
    variance. With the order a uniform shuffle of every peer's slots, that is a uniform sample without replacement
    of ``j`` useful groups (rejection sampling along the shuffle), reading only the peers it lands on.
    ``pool``: the groups read, for the counts of the :class:`Selection`."""
    if j < 0:
        raise ValueError(f"j must be >= 0, got {j}")
    chosen: list[ScoredGroup] = []
    for peer, k in order:
        if len(chosen) >= j:
            break
        group = slot(peer, k)
        if group is not None and group.has_variance:
            chosen.append(group)
    return Selection(tuple(chosen), j, len(pool), sum(not g.has_variance for g in pool))


def rng_for(seed: int, node_id: str, round_: int, stage: int = 0, purpose: str = "sapo") -> random.Random:
    """A ``random.Random`` seeded by a stable hash of its inputs (not Python's salted ``hash``)."""
    digest = hashlib.sha256(f"{purpose}|{seed}|{node_id}|{round_}|{stage}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def select_external(pool: list[ScoredGroup], j: int, rng: random.Random) -> Selection:
    """Drop zero-variance groups, then sample ``j`` uniformly without replacement.

    The pool is put in a canonical order first, so the result does not depend on the
    order in which files were listed.
    """
    if j < 0:
        raise ValueError(f"j must be >= 0, got {j}")
    ordered = sorted(pool, key=lambda g: (g.source, g.group.group_id))
    useful = [g for g in ordered if g.has_variance]
    chosen = rng.sample(useful, k=min(j, len(useful))) if j else []
    return Selection(tuple(chosen), j, len(pool), len(ordered) - len(useful))
