"""Issue #30, class 4: a peer's completion is trained on exactly what was scored.

A hostile peer sends a completion of MAX_NEW_TOKENS random tokens followed by the right answer. A receiver
trains on the first MAX_NEW_TOKENS ids only; if it scored the whole text, the answer in the tail would buy a
reward for the random tokens in front of it. The receiver must score the text of the ids it trains on: the
random tokens alone, worth nothing. An honest completion within the cap keeps its ids and its reward.

In process, with the tiny model's tokenizer, reasoning-gym's basic_arithmetic verifier, and the gather's own
re-scoring (:func:`swarm_gdrive.protocol.gather.score_batch` with :meth:`GRPOWorkload.rescore`), as a worker
reads a peer's batch. :func:`tail_past_cap` is the planting function, for a fuzzer or a trial run with the
grpo workload: it returns a peer's group whose first completion carries the right answer past the cap.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("reasoning_gym")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from swarm_gdrive.protocol.gather import score_batch  # noqa: E402
from swarm_gdrive.protocol.records import RolloutBatch, RolloutGroup, decode, encode  # noqa: E402
from swarm_gdrive.protocol.sapo import ScoredGroup  # noqa: E402
from swarm_gdrive.protocol.workload import StageContext  # noqa: E402
from swarm_gdrive.training.completions import CompletionCodec  # noqa: E402
from swarm_gdrive.training.policy import TrainGroup  # noqa: E402

RUN = "0123456789abcdef"
CAP = 16
FORMAT_WEIGHT = 0.5
CTX = StageContext("w1", 0, 0, 42)

pytestmark = pytest.mark.usefixtures("one_thread")


def workload_for(tmp_path: Path, tiny_folder: Path, **env: str) -> Any:
    from swarm_gdrive.config import from_env
    from swarm_gdrive.storage import LocalStorage
    from swarm_gdrive.training.grpo_workload import GRPOWorkload

    (tmp_path / "drive").mkdir(exist_ok=True)
    base = {
        "GDRIVE_PATH": str(tmp_path / "drive"),
        "EXPERIMENT_NAME": "scored",
        "MODEL_NAME": str(tiny_folder),
        "TASKS": "basic_arithmetic",
        "TASK_CONFIG": '{"basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}',
        "DEVICE": "cpu",
        "SWARM_LOCAL_DIR": str(tmp_path / "local"),
        "MODEL_CACHE_DIR": str(tmp_path / "models"),
        "NUM_TRAIN_SAMPLES": "1",
        "NUM_GENERATIONS": "4",
        "MAX_NEW_TOKENS": str(CAP),
        "ANSWER_PREFIX": "false",
        "FORMAT_REWARD_WEIGHT": str(FORMAT_WEIGHT),
        "LEARNING_RATE": "1e-3",
    }
    return GRPOWorkload(from_env({**base, **env}), LocalStorage(base["GDRIVE_PATH"]), "w1", threading.Event())


def random_ids(codec: CompletionCodec, n: int, rng: random.Random) -> list[int]:
    """``n`` ids drawn from the vocabulary, no special token, whose text holds no answer tag."""
    pool = [
        i
        for i in range(codec.vocab_size)
        if i not in codec.special and "<" not in codec.tokenizer.decode([i]) and ">" not in codec.tokenizer.decode([i])
    ]
    return [rng.choice(pool) for _ in range(n)]


def tail_past_cap(
    codec: CompletionCodec, question: Any, rng: random.Random, with_ids: bool = True, group_id: str = "r0-s0-g0"
) -> RolloutGroup:
    """A peer's group for ``question`` (a TaskBank Question), its completions:

    0. the attack: MAX_NEW_TOKENS random ids, then ``<answer>`` + the right answer + ``</answer>``;
    1. honest, long but within the cap: words, then the right answer, up to MAX_NEW_TOKENS ids (its text
       re-tokenizes to the same ids, as a sampled text mostly does);
    2. honest and short, right: ``<answer>`` + the answer, stopped on eos;
    3. honest and short, wrong.

    ``with_ids``: the sampled ids travel with the texts (same tokenizer); else the texts alone (an older writer,
    another tokenizer, or ids too big to share), which the receiver re-tokenizes."""
    tok = codec.tokenizer
    answer = str(question.entry["answer"])
    tagged = codec.encode(f"<answer>{answer}</answer>")
    attack = random_ids(codec, codec.max_new_tokens, rng) + tagged
    words = ["The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "0123456789", "+", "-", "*"]
    kept = max(
        (
            n
            for n in range(len(words) + 1)
            if len(codec.encode(" ".join(words[:n]) + f" <answer>{answer}</answer>")) <= codec.max_new_tokens
        ),
    )
    honest = codec.encode(" ".join(words[:kept]) + f" <answer>{answer}</answer>")
    short = list(tagged)
    wrong = codec.encode(f"<answer>{int(answer) + 1}</answer>")
    ids = [attack, honest, short, wrong]
    texts = [tok.decode(c) for c in ids]
    assert all(codec.consistent(c, t) for c, t in zip(ids, texts, strict=True))
    # A real attack on either path: no answer tag within the cap, of the sampled ids or of the text re-tokenized.
    assert "<" not in tok.decode(attack[: codec.max_new_tokens])
    assert "<answer>" not in tok.decode(codec.encode(texts[0])[: codec.max_new_tokens])
    assert codec.max_new_tokens - 3 <= len(honest) <= codec.max_new_tokens
    return RolloutGroup(
        group_id=group_id,
        task=question.task,
        question=question.question,
        provenance=question.provenance,
        completions=texts,
        rewards=[1.5, 1.5, 1.5, 0.0],  # claimed; a receiver never reads them
        stop_reasons=["length", "length", "eos", "eos"],
        tokenizer=codec.fingerprint if with_ids else None,
        token_ids=ids if with_ids else None,
    )


def read_as_peer(workload: Any, groups: list[RolloutGroup], node: str = "w2") -> list[ScoredGroup]:
    """What a worker's gather makes of ``node``'s batch: decoded from its bytes and re-scored here."""
    batch = RolloutBatch(node_id=node, run_id=RUN, round=0, stage=0, groups=groups, created_at=1.0)
    batch = decode(encode(batch), RolloutBatch)
    scored, rejected = score_batch(CTX, node, batch, workload.rescore, lambda *a, **k: None, {})
    assert rejected == 0
    return scored


def trained(workload: Any, external: list[ScoredGroup]) -> tuple[list[TrainGroup], dict[str, float]]:
    """The groups the trainer's step received (the step still runs), and the stage's metrics."""
    seen: list[TrainGroup] = []
    step = workload.trainer.step

    def spy(groups: list[TrainGroup]) -> dict[str, float]:
        seen.extend(groups)
        return step(groups)

    workload.trainer.step = spy
    try:
        metrics = workload.train(CTX, [], external)
    finally:
        workload.trainer.step = step
    return seen, metrics


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory, tiny_folder: Path) -> Any:
    return workload_for(tmp_path_factory.mktemp("scored"), tiny_folder)


@pytest.fixture(scope="module")
def question(workload: Any) -> Any:
    return workload.bank.draw(1, random.Random(7))[0]


@pytest.mark.parametrize("with_ids", [True, False], ids=["sampled-ids", "retokenized"])
def test_a_right_answer_past_max_new_tokens_buys_no_reward(workload: Any, question: Any, with_ids: bool) -> None:
    codec: CompletionCodec = workload.codec
    planted = tail_past_cap(codec, question, random.Random(3), with_ids=with_ids)
    whole = workload._score(question.entry, planted.completions)
    assert whole[0] == 1.0 + FORMAT_WEIGHT, "the attack's whole text holds the right answer"

    scored = read_as_peer(workload, [planted])
    groups, metrics = trained(workload, scored)

    assert len(groups) == 1
    attack, honest, short, wrong = zip(groups[0].completion_ids, groups[0].rewards, strict=True)
    attack_ids, attack_reward = attack
    assert len(attack_ids) == CAP and codec.eos_id not in attack_ids
    assert attack_reward == 0.0, f"trained on {codec.tokenizer.decode(attack_ids)!r} with reward {attack_reward}"
    assert honest[1] == short[1] == 1.0 + FORMAT_WEIGHT and wrong[1] == FORMAT_WEIGHT
    if with_ids:
        assert list(honest[0]) == (planted.token_ids or [])[1], "an honest completion within the cap keeps its ids"
    assert list(honest[0]) == codec.encode(planted.completions[1]) and short[0][-1] == codec.eos_id
    # The mechanism: every reward is the verifier's score of the decoding of exactly the ids trained.
    texts = [codec.tokenizer.decode(ids, skip_special_tokens=True) for ids in groups[0].completion_ids]
    assert workload._score(question.entry, texts) == tuple(groups[0].rewards)
    assert metrics["external/cut_to_cap"] == 1.0
    assert metrics["external/sampled_ids"] == (4.0 if with_ids else 0.0)
    assert metrics["reward/external_max"] == 1.0 + FORMAT_WEIGHT


def test_a_peer_with_a_larger_cap_is_trained_on_what_fits_and_scored_on_it(
    tmp_path: Path, tiny_folder: Path, question: Any
) -> None:
    """MAX_NEW_TOKENS is no experiment setting: a peer sampling 32 tokens is honest. Its answer within this node's
    cap keeps its reward; one past it is scored on the kept text, as it is trained."""
    sender = workload_for(tmp_path, tiny_folder, MAX_NEW_TOKENS="32")
    receiver = workload_for(tmp_path, tiny_folder, MAX_NEW_TOKENS=str(CAP))
    codec: CompletionCodec = sender.codec
    answer = str(question.entry["answer"])
    tagged = codec.encode(f"<answer>{answer}</answer>")
    rng = random.Random(5)
    early = tagged + random_ids(codec, 32 - len(tagged), rng)  # the answer first, then more words: within 16
    late = random_ids(codec, 32 - len(tagged), rng) + tagged  # the answer at tokens 25..32: past 16
    wrong = codec.encode(f"<answer>{int(answer) + 1}</answer>")
    ids = [early, late, wrong]
    group = RolloutGroup(
        group_id="r0-s0-g0",
        task=question.task,
        question=question.question,
        provenance=question.provenance,
        completions=[codec.tokenizer.decode(c) for c in ids],
        rewards=[1.5, 1.5, 0.0],
        stop_reasons=["length", "length", "eos"],
        tokenizer=codec.fingerprint,
        token_ids=ids,
    )
    scored = read_as_peer(receiver, [group])
    assert scored[0].rewards == (1.0 + FORMAT_WEIGHT, 0.0, FORMAT_WEIGHT)
    groups, metrics = trained(receiver, scored)
    assert groups[0].completion_ids[:2] == [early[:CAP], late[:CAP]]
    assert metrics["external/cut_to_cap"] == 2.0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.data(),
    cap=st.integers(min_value=1, max_value=24),
    reason=st.sampled_from(["eos", "length", None]),
    send_ids=st.booleans(),
)
def test_the_scored_text_is_the_decoding_of_the_trained_ids(
    workload: Any, data: st.DataObject, cap: int, reason: str | None, send_ids: bool
) -> None:
    """Whatever a peer sends (ids or not, any length, any stop reason): ``Received.text`` is the decoding of the ids
    trained, eos left out, and they fit MAX_NEW_TOKENS."""
    base: CompletionCodec = workload.codec
    codec = CompletionCodec(base.tokenizer, base.eos_ids, cap)
    pool = [i for i in range(codec.vocab_size) if i not in codec.special]
    ids = data.draw(st.lists(st.sampled_from(pool), max_size=40))
    text = codec.tokenizer.decode(ids)
    got = codec.incoming(text, reason, ids if send_ids else None, codec.fingerprint if send_ids else None)
    body = got.ids[:-1] if got.ids and got.ids[-1] == codec.eos_id else got.ids
    assert len(got.ids) <= cap
    assert codec.tokenizer.decode(body, skip_special_tokens=True) == got.text
    assert got.cut == (len(ids if got.how == "sampled" else codec.encode(text)) > cap)
    if not got.cut and got.how == "sampled":
        assert got.text == text


def test_cut_completions_are_logged_once_per_peer_and_round(
    workload: Any, question: Any, caplog: pytest.LogCaptureFixture
) -> None:
    planted = tail_past_cap(workload.codec, question, random.Random(3))
    scored = read_as_peer(workload, [planted], node="w9")
    caplog.set_level("INFO", logger="swarm_gdrive.training.grpo_workload")
    for round_ in (5, 5, 6):
        workload.train(StageContext("w1", round_, 0, 42), [], scored)
    said = [r.getMessage() for r in caplog.records if "ran past MAX_NEW_TOKENS" in r.getMessage()]
    assert said == [
        f"round {r}: 1 completion(s) of w9 ran past MAX_NEW_TOKENS={CAP}; each is trained on its first {CAP} tokens "
        "and scored on their text alone"
        for r in (5, 6)
    ]
