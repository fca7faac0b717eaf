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


def test_padded_synthetic_completions_are_as_long_as_asked_and_score_as_the_bare_ones():
    """The benchmark's ``--completion-chars``: batches as large as a model's, the same answers and rewards."""
    ctx = StageContext("w1", 3, 0, 42)
    bare = list(SyntheticWorkload(4, 4, 0.0).generate(ctx))
    padded = list(SyntheticWorkload(4, 4, 0.0, completion_chars=1000).generate(ctx))
    assert all(len(c) == 1000 for g in padded for c in g.completions)
    assert [g.rewards for g in padded] == [g.rewards for g in bare]
    assert any(r == 1.0 for g in bare for r in g.rewards) and any(r == 0.0 for g in bare for r in g.rewards)
    assert [[c.split()[0] for c in g.completions] for g in padded] == [g.completions for g in bare]
    work = SyntheticWorkload(4, 4, 0.0, completion_chars=1000)
    assert all(work.rescore(ctx, g) == tuple(g.rewards) for g in padded)


def test_synthetic_questions_are_seeded_by_node_and_round():
    work = SyntheticWorkload(num_samples=4, num_generations=2, step_seconds=0.0)
    a = [g.question for g in work.generate(StageContext("w1", 0, 0, 42))]
    assert a == [g.question for g in work.generate(StageContext("w1", 0, 0, 42))]
    assert a != [g.question for g in work.generate(StageContext("w2", 0, 0, 42))]
    assert a != [g.question for g in work.generate(StageContext("w1", 1, 0, 42))]


# -- SAPO_MAX_PEERS > 0: the drawn order of (peer, group) slots, read lazily ---------------------------------------


def _publish_batches(tmp_path, peers: dict[str, list[tuple[float, ...]]]):
    """Each peer's rollout batch of round 0, stage 0 (its groups' own rewards: the re-score below keeps them)."""
    from swarm_gdrive.protocol.exchange import Exchange
    from swarm_gdrive.protocol.layout import Layout
    from swarm_gdrive.protocol.records import RolloutBatch
    from swarm_gdrive.storage import LocalStorage

    run = "0123456789abcdef"
    for peer, rewards in peers.items():
        writer = Exchange(LocalStorage(tmp_path), Layout("exp"), peer, run_id=run)
        groups = []
        for i, r in enumerate(rewards):
            g = group(peer, i, r).group.model_copy(update={"rewards": list(r)})
            groups.append(g)
        writer.write_rollouts(
            RolloutBatch(node_id=peer, run_id=run, round=0, stage=0, groups=groups, complete=True, created_at=1.0)
        )
    return Exchange(LocalStorage(tmp_path), Layout("exp"), "me", run_id=run)


def _lazy_gather(exchange, live, j, max_peers, per_peer, seed=7, round_=0):
    import threading

    from swarm_gdrive.protocol.gather import PeerGather
    from swarm_gdrive.protocol.polling import Backoff
    from swarm_gdrive.protocol.sapo import select_in_order

    events = []
    gather = PeerGather(
        exchange,
        StageContext("me", round_, 0, seed),
        live,
        max_peers,
        j,
        lambda _ctx, g: tuple(g.rewards),
        lambda *a, **k: events.append(a[0]),
        groups_per_peer=per_peer,
    )
    got = gather.run(threading.Event(), 2, Backoff(0.01, 0.02))
    return got, select_in_order(got.order, got.slot, got.pool(), j), events


def test_the_lazy_gather_reads_about_j_peers_of_a_large_swarm_and_chooses_j(tmp_path):
    peers = {f"w{i}": [(0.0, 1.0)] * 4 for i in range(15)}
    exchange = _publish_batches(tmp_path, peers)
    got, sel, events = _lazy_gather(exchange, ["me", *peers], j=4, max_peers=8, per_peer=4)
    assert len(sel.chosen) == 4 and len({(g.source, g.group.group_id) for g in sel.chosen}) == 4
    assert len(got.batches) <= 4, "only the peers the first four slots land on are read"
    assert {g.source for g in sel.chosen} <= set(got.batches)
    assert "rollout_wait_expired" not in events


def test_the_lazy_gather_reads_on_past_zero_variance_groups_up_to_k_peers(tmp_path):
    flat = {f"w{i}": [(1.0, 1.0)] * 4 for i in range(10)}  # no GRPO signal anywhere...
    useful = {"w10": [(0.0, 1.0)] * 4}  # ...but in one peer
    exchange = _publish_batches(tmp_path, {**flat, **useful})
    got, sel, _ = _lazy_gather(exchange, ["me", *flat, *useful], j=2, max_peers=10, per_peer=4)
    assert len(sel.chosen) == 2 and all(g.source == "w10" for g in sel.chosen)  # seed 7 reaches w10 by peer 10
    assert sel.zero_variance_dropped == 4 * (len(got.batches) - 1) and 1 < len(got.batches) <= 10
    capped, sel, _ = _lazy_gather(exchange, ["me", *flat, *useful], j=2, max_peers=3, per_peer=4, seed=8)
    assert len(capped.batches) <= 3, "never more than SAPO_MAX_PEERS peers"
    assert sel.shortfall == 2 - len(sel.chosen)


def test_the_lazy_draw_is_a_uniform_sample_of_the_useful_groups_of_every_peer(tmp_path):
    """Every useful group of the swarm is chosen equally often over many rounds' draws. The instrument: drawing a
    peer first and then one of its useful groups, a natural shortcut, picks the groups of the peer with fewer useful
    ones twice as often, and the same bounds catch it."""
    from swarm_gdrive.protocol.gather import Gathered
    from swarm_gdrive.protocol.sapo import select_in_order

    # five peers, four groups each; w0's groups alternate useful/flat: 18 useful groups in all
    pools = {f"w{p}": [group(f"w{p}", i, (0.0, 1.0) if p or i % 2 else (1.0, 1.0)) for i in range(4)] for p in range(5)}
    gathered = Gathered(scored=pools)
    from swarm_gdrive.protocol.records import RolloutBatch

    for peer, groups in pools.items():
        gathered.batches[peer] = RolloutBatch(
            node_id=peer,
            run_id="abcdef12",
            round=0,
            stage=0,
            groups=[g.group for g in groups],
            complete=True,
            created_at=1.0,
        )
    counts: dict[str, int] = {}
    rounds, j = 3000, 3
    for r in range(rounds):
        order = [(p, k) for p in pools for k in range(4)]
        rng_for(1, "me", r, purpose="slots").shuffle(order)
        for g in select_in_order(order, gathered.slot, gathered.pool(), j).chosen:
            counts[g.group.group_id] = counts.get(g.group.group_id, 0) + 1
    expected = rounds * j / 18  # 500

    def uniform(counts: dict[str, int]) -> bool:
        return len(counts) == 18 and all(0.85 * expected < c < 1.15 * expected for c in counts.values())

    assert not any(c for gid, c in counts.items() if gid in ("w0-0", "w0-2")), "flat groups are never chosen"
    assert uniform(counts), counts
    peer_first: dict[str, int] = {}
    for r in range(rounds):
        rng = rng_for(1, "me", r, purpose="peer-first")
        left = {p: [g for g in groups if g.has_variance] for p, groups in pools.items()}
        for _ in range(j):
            peer = rng.choice(sorted(p for p, gs in left.items() if gs))
            chosen = left[peer].pop(rng.randrange(len(left[peer])))
            peer_first[chosen.group.group_id] = peer_first.get(chosen.group.group_id, 0) + 1
    assert not uniform(peer_first), peer_first
