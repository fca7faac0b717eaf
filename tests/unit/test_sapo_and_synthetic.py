"""SAPO external-group selection (pure) and the synthetic workload's provenance check."""

from __future__ import annotations

from swarm_gdrive.protocol.records import Provenance, RolloutGroup
from swarm_gdrive.protocol.sapo import ScoredGroup, rng_for, select_external
from swarm_gdrive.protocol.workload import StageContext, SyntheticWorkload


def group(source: str, i: int, rewards: tuple[float, ...]) -> ScoredGroup:
    g = RolloutGroup(
        group_id=f"{source}-{i}",
        task="t",
        question="q",
        provenance=Provenance(dataset="d", seed=0, index=i),
        completions=["x"] * len(rewards),
        rewards=[0.0] * len(rewards),
    )
    return ScoredGroup(source, g, rewards)


def test_zero_variance_groups_are_dropped_before_sampling():
    pool = [group("a", 0, (1.0, 1.0)), group("a", 1, (0.0, 1.0)), group("b", 0, (0.0, 0.0)), group("b", 1, (0.5, 0))]
    sel = select_external(pool, 4, rng_for(1, "w", 0))
    assert {g.group.group_id for g in sel.chosen} == {"a-1", "b-1"}
    assert sel.zero_variance_dropped == 2 and sel.offered == 4 and sel.shortfall == 2


def test_selection_is_deterministic_and_independent_of_listing_order():
    pool = [group(s, i, (0.0, 1.0)) for s in "abc" for i in range(5)]
    first = select_external(pool, 4, rng_for(42, "w1", 3))
    again = select_external(list(reversed(pool)), 4, rng_for(42, "w1", 3))
    assert [g.group.group_id for g in first.chosen] == [g.group.group_id for g in again.chosen]
    other_round = select_external(pool, 4, rng_for(42, "w1", 4))
    other_node = select_external(pool, 4, rng_for(42, "w2", 3))
    ids = [g.group.group_id for g in first.chosen]
    assert ids != [g.group.group_id for g in other_round.chosen] or ids != [g.group.group_id for g in other_node.chosen]
    assert len(set(ids)) == 4 and first.shortfall == 0


def test_j_zero_takes_nothing():
    sel = select_external([group("a", 0, (0.0, 1.0))], 0, rng_for(0, "w", 0))
    assert sel.chosen == () and sel.shortfall == 0


def test_selection_is_roughly_uniform():
    pool = [group("a", i, (0.0, 1.0)) for i in range(4)]
    counts = dict.fromkeys(range(4), 0)
    for r in range(4000):
        (chosen,) = select_external(pool, 1, rng_for(0, "w", r)).chosen
        counts[chosen.group.provenance.index] += 1
    assert all(850 < c < 1150 for c in counts.values()), counts


def test_synthetic_rescore_recomputes_rewards_and_rejects_forged_questions():
    work = SyntheticWorkload(num_samples=3, num_generations=4, step_seconds=0.0)
    ctx = StageContext("w1", 0, 0, 42)
    groups = list(work.generate(ctx))
    assert len(groups) == 3 and all(len(g.completions) == 4 for g in groups)
    for g in groups:
        assert work.rescore(ctx, g) == tuple(g.rewards)
    honest = groups[0]
    lying = honest.model_copy(update={"rewards": [1.0] * 4})
    assert work.rescore(ctx, lying) == tuple(honest.rewards)  # claimed rewards are ignored
    forged = honest.model_copy(update={"question": "What is 1 + 1?"})
    assert work.rescore(ctx, forged) is None
    wrong_dataset = honest.model_copy(update={"provenance": honest.provenance.model_copy(update={"dataset": "x"})})
    assert work.rescore(ctx, wrong_dataset) is None


def test_synthetic_questions_are_seeded_by_node_and_round():
    work = SyntheticWorkload(num_samples=4, num_generations=2, step_seconds=0.0)
    a = [g.question for g in work.generate(StageContext("w1", 0, 0, 42))]
    assert a == [g.question for g in work.generate(StageContext("w1", 0, 0, 42))]
    assert a != [g.question for g in work.generate(StageContext("w2", 0, 0, 42))]
    assert a != [g.question for g in work.generate(StageContext("w1", 1, 0, 42))]
