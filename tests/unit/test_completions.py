"""External rollouts arrive as they were sampled: stop reasons, sampled ids, and what a receiver trains on."""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from swarm_gdrive.protocol.records import (  # noqa: E402
    MAX_COMPLETION_CHARS,
    MAX_COMPLETION_TOKENS,
    Provenance,
    RecordError,
    RolloutBatch,
    RolloutGroup,
    decode,
    encode,
)
from swarm_gdrive.protocol.sapo import ScoredGroup  # noqa: E402
from swarm_gdrive.protocol.workload import StageContext  # noqa: E402
from swarm_gdrive.training.completions import CompletionCodec, external_metrics, tokenizer_fingerprint  # noqa: E402
from swarm_gdrive.training.models import load_model_and_tokenizer  # noqa: E402

CPU = torch.device("cpu")
RUN = "0123456789abcdef"

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tokenizer(tiny_folder: Path) -> Any:
    return load_model_and_tokenizer(str(tiny_folder), CPU, torch.float32)[1]


def codec_for(tokenizer: Any, max_new_tokens: int = 16) -> CompletionCodec:
    return CompletionCodec(tokenizer, {tokenizer.eos_token_id}, max_new_tokens)


def char_by_char(tokenizer: Any, text: str) -> list[int]:
    """Ids that spell ``text`` one character at a time: they decode to it, and encoding it merges them."""
    ids = [i for c in text for i in tokenizer(c, add_special_tokens=False)["input_ids"]]
    assert tokenizer.decode(ids) == text
    assert tokenizer(text, add_special_tokens=False)["input_ids"] != ids
    return ids


# --- the receiver ----------------------------------------------------------------------------------------------


def test_a_completion_that_stopped_on_eos_gets_exactly_one_eos(tokenizer: Any) -> None:
    codec = codec_for(tokenizer)
    text = "<answer>7</answer>"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    got = codec.incoming(text, "eos", None, None)
    assert got.ids == ids + [tokenizer.eos_token_id]
    assert got.ids.count(tokenizer.eos_token_id) == 1
    sampled = codec.incoming(text, "eos", ids, codec.fingerprint)
    assert sampled.ids == ids + [tokenizer.eos_token_id] and sampled.how == "sampled"


@pytest.mark.parametrize("reason", ["length", None])
def test_a_receiver_never_invents_an_eos(tokenizer: Any, reason: str | None) -> None:
    """A short completion cut at the sender's cap (``length``), or one of an older record (no reason): no eos."""
    codec = codec_for(tokenizer)
    text = "<answer>7"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) < codec.max_new_tokens
    assert codec.incoming(text, reason, None, None).ids == ids
    assert codec.incoming(text, reason, ids, codec.fingerprint).ids == ids


def test_a_special_token_name_in_a_text_stays_plain_text(tokenizer: Any) -> None:
    codec = codec_for(tokenizer, max_new_tokens=64)
    got = codec.incoming("7<|eos|>", None, None, None)
    assert tokenizer.eos_token_id not in got.ids
    assert tokenizer.decode(got.ids) == "7<|eos|>"


def test_a_long_completion_is_cut_at_the_cap_without_eos(tokenizer: Any) -> None:
    text = "The quick brown fox jumps over the lazy dog 0123456789 + - * / = ( ) [ ] , . ? !"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    codec = codec_for(tokenizer, max_new_tokens=len(ids) - 3)
    for got in (codec.incoming(text, "eos", None, None), codec.incoming(text, "eos", ids, codec.fingerprint)):
        assert got.ids == ids[: len(ids) - 3]
    exactly = codec_for(tokenizer, max_new_tokens=len(ids))  # no room left for the eos
    assert exactly.incoming(text, "eos", ids, exactly.fingerprint).ids == ids
    one_more = codec_for(tokenizer, max_new_tokens=len(ids) + 1)
    assert one_more.incoming(text, "eos", ids, one_more.fingerprint).ids == ids + [tokenizer.eos_token_id]


def test_same_tokenizer_trains_on_exactly_the_sampled_ids_even_when_text_would_retokenize_otherwise(
    tokenizer: Any,
) -> None:
    codec = codec_for(tokenizer, max_new_tokens=64)
    text = "<answer>7</answer>"
    ids = char_by_char(tokenizer, text)
    got = codec.incoming(text, "length", ids, codec.fingerprint)
    assert got.ids == ids and got.how == "sampled" and got.differs
    metrics = external_metrics([got])
    assert metrics["external/retokenized"] == 0.0 and metrics["external/ids_rejected"] == 0.0
    assert metrics["external/sampled_ids"] == 1.0 and metrics["external/retokenize_differs"] == 1.0


def test_a_saved_and_reloaded_tokenizer_keeps_its_fingerprint(tokenizer: Any, tmp_path: Path) -> None:
    """A checkpoint's tokenizer (a resumed node) is the original's: peers keep using each other's ids."""
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path)
    assert tokenizer_fingerprint(AutoTokenizer.from_pretrained(tmp_path)) == tokenizer_fingerprint(tokenizer)


def test_another_tokenizer_re_tokenizes_and_is_counted(tokenizer: Any) -> None:
    other = copy.deepcopy(tokenizer)
    other.add_tokens(["<answer>7"])
    assert tokenizer_fingerprint(other) != tokenizer_fingerprint(tokenizer)
    assert tokenizer_fingerprint(copy.deepcopy(tokenizer)) == tokenizer_fingerprint(tokenizer)
    sender, receiver = codec_for(other, 64), codec_for(tokenizer, 64)
    text = "<answer>7</answer>"
    sent = sender.outgoing("", [], other(text, add_special_tokens=False)["input_ids"], text)
    got = receiver.incoming(sent.text, sent.stop_reason, sent.token_ids, sender.fingerprint)
    assert got.how == "retokenized" and got.ids == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert external_metrics([got])["external/retokenized"] == 1.0


@pytest.mark.parametrize(
    "forge",
    [
        lambda tok, ids: tok("<answer>8</answer>", add_special_tokens=False)["input_ids"],  # another text
        lambda tok, ids: ids[:1] + [tok.eos_token_id] + ids[1:],  # a special token that decode would skip
        lambda tok, ids: ids[:-1] + [len(tok) + 5],  # beyond the receiver's vocabulary
        lambda tok, ids: [],
    ],
    ids=["other-text", "hidden-special", "out-of-vocab", "empty"],
)
def test_forged_ids_inconsistent_with_the_text_are_not_used_and_are_counted(tokenizer: Any, forge: Any) -> None:
    codec = codec_for(tokenizer, max_new_tokens=64)
    text = "<answer>7</answer>"
    honest = tokenizer(text, add_special_tokens=False)["input_ids"]
    got = codec.incoming(text, "length", forge(tokenizer, honest), codec.fingerprint)
    assert got.how == "rejected" and got.ids == honest
    metrics = external_metrics([got])
    assert metrics["external/ids_rejected"] == 1.0 and metrics["external/retokenized"] == 1.0


# --- the sender ------------------------------------------------------------------------------------------------


def test_outgoing_marks_stop_reasons_and_shares_ids_without_eos(tokenizer: Any) -> None:
    codec = codec_for(tokenizer)
    eos = tokenizer.eos_token_id
    prefix_ids = tokenizer("<answer>", add_special_tokens=False)["input_ids"]
    body = tokenizer("7</answer>", add_special_tokens=False)["input_ids"]
    stopped = codec.outgoing(
        "<answer>", prefix_ids, body + [eos], tokenizer.decode(body + [eos], skip_special_tokens=True)
    )
    assert stopped.text == "<answer>7</answer>" and stopped.stop_reason == "eos"
    assert stopped.token_ids == prefix_ids + body
    cut = codec.outgoing("<answer>", prefix_ids, body, tokenizer.decode(body))
    assert cut.stop_reason == "length" and cut.token_ids == prefix_ids + body


def test_a_text_cut_to_fit_a_rollout_file_travels_as_length_without_ids(tokenizer: Any) -> None:
    codec = codec_for(tokenizer)
    text = "7" * MAX_COMPLETION_CHARS
    sent = codec.outgoing("<answer>", [5], [9, tokenizer.eos_token_id], text)
    assert len(sent.text) == MAX_COMPLETION_CHARS and sent.stop_reason == "length" and sent.token_ids is None


# --- records ---------------------------------------------------------------------------------------------------


def batch_with(**fields: Any) -> bytes:
    group = {
        "group_id": "g0",
        "task": "basic_arithmetic",
        "question": "What is 2 + 2?",
        "provenance": {"dataset": "basic_arithmetic", "seed": 7, "index": 3},
        "completions": ["4", "5"],
        "rewards": [1.0, 0.0],
        **fields,
    }
    raw = {"kind": "rollouts", "schema_version": 1, "node_id": "w1", "run_id": RUN, "round": 0, "stage": 0}
    return json.dumps({**raw, "groups": [group], "created_at": 1.0}).encode()


def test_an_older_record_without_the_new_fields_decodes_and_trains_without_eos(tokenizer: Any) -> None:
    batch = decode(batch_with(), RolloutBatch)
    group = batch.groups[0]
    assert group.stop_reasons is None and group.token_ids is None and group.tokenizer is None
    assert b"stop_reasons" not in encode(batch)  # absent fields stay absent: older readers accept the group
    assert tokenizer.eos_token_id not in codec_for(tokenizer).incoming("4", None, None, None).ids


FP = "0" * 16


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"stop_reasons": ["eos"]}, "stop_reasons and completions differ in length"),
        ({"stop_reasons": ["eos", "timeout"]}, "groups.0.stop_reasons.1: Input should be 'eos' or 'length'"),
        ({"stop_reasons": "eos"}, "groups.0.stop_reasons: Input should be a valid array"),
        ({"token_ids": [[1], [2]]}, "token_ids without the tokenizer fingerprint"),
        ({"tokenizer": FP, "token_ids": [[1]]}, "token_ids and completions differ in length"),
        ({"tokenizer": "xyz", "token_ids": [[1], [2]]}, "groups.0.tokenizer: String should match pattern"),
        ({"tokenizer": FP, "token_ids": [[-1], [2]]}, "groups.0.token_ids.0.0: Input should be greater than"),
        ({"tokenizer": FP, "token_ids": [[2**31], [2]]}, "groups.0.token_ids.0.0: Input should be less than"),
        ({"tokenizer": FP, "token_ids": [[10**30], [2]]}, "groups.0.token_ids.0.0: Input should be less than"),
        ({"tokenizer": FP, "token_ids": [[1.0], [2]]}, "groups.0.token_ids.0.0: Input should be a valid integer"),
        ({"tokenizer": FP, "token_ids": [[True], [2]]}, "groups.0.token_ids.0.0: Input should be a valid integer"),
        (
            {"tokenizer": FP, "token_ids": [[1] * (MAX_COMPLETION_TOKENS + 1), None]},
            f"groups.0.token_ids.0: List should have at most {MAX_COMPLETION_TOKENS} items",
        ),
    ],
)
def test_hostile_new_fields_are_rejected_as_record_errors(fields: dict[str, Any], reason: str) -> None:
    with pytest.raises(RecordError, match="schema: ") as info:
        decode(batch_with(**fields), RolloutBatch)
    assert reason in str(info.value)


def test_a_huge_integer_id_is_a_record_error() -> None:
    data = batch_with(tokenizer=FP, token_ids=[[1], [2]]).replace(b"[[1]", b"[[" + b"9" * 5000 + b"]")
    with pytest.raises(RecordError, match="an integer of more than"):
        decode(data, RolloutBatch)


def test_config_caps_max_new_tokens_at_what_a_record_carries(tmp_path: Path) -> None:
    from swarm_gdrive.config import ConfigError, from_env

    env = {"GDRIVE_PATH": str(tmp_path), "ROLE": "coordinator"}
    assert from_env({**env, "MAX_NEW_TOKENS": str(MAX_COMPLETION_TOKENS)}).max_new_tokens == MAX_COMPLETION_TOKENS
    with pytest.raises(ConfigError, match="MAX_NEW_TOKENS"):
        from_env({**env, "MAX_NEW_TOKENS": str(MAX_COMPLETION_TOKENS + 1)})


# --- the workload: a sender and a receiver ---------------------------------------------------------------------


def with_eos_bias(model: Any, eos_id: int, bias: float, never: list[int]) -> None:
    """Give the LM head a bias towards eos so that some sampled completions stop before the cap, and none
    to the ids of ``never`` (special tokens mid-completion: their ids would not travel, the text does not hold them)."""
    old = model.lm_head
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.zero_()
        head.bias[never] = -1e4
        head.bias[eos_id] = bias
    model.lm_head = head


def workload_for(tmp_path: Path, tiny_folder: Path, **env: str) -> Any:
    from swarm_gdrive.config import from_env
    from swarm_gdrive.storage import LocalStorage
    from swarm_gdrive.training.grpo_workload import GRPOWorkload

    (tmp_path / "drive").mkdir(exist_ok=True)
    base = {
        "GDRIVE_PATH": str(tmp_path / "drive"),
        "EXPERIMENT_NAME": "travel",
        "MODEL_NAME": str(tiny_folder),
        "TASKS": "basic_arithmetic",
        "DEVICE": "cpu",
        "SWARM_LOCAL_DIR": str(tmp_path / "local"),
        "MODEL_CACHE_DIR": str(tmp_path / "models"),
        "NUM_TRAIN_SAMPLES": "3",
        "NUM_GENERATIONS": "4",
        "MAX_NEW_TOKENS": "8",
        "ANSWER_PREFIX": "true",
        "LEARNING_RATE": "1e-3",
    }
    return GRPOWorkload(from_env({**base, **env}), LocalStorage(base["GDRIVE_PATH"]), "w1", threading.Event())


def test_peers_train_an_external_group_on_exactly_the_ids_its_sender_trains_on(
    tmp_path: Path, tiny_folder: Path
) -> None:
    """Prefix included, the cap counted the same way, eos only where the model stopped: local == external."""
    workload = workload_for(tmp_path, tiny_folder)
    eos = workload.trainer.tokenizer.eos_token_id
    with_eos_bias(workload.trainer.model, eos, 3.0, sorted(workload.codec.special))
    groups = list(workload.generate(StageContext("w1", 0, 0, 42)))
    batch = RolloutBatch(node_id="w1", run_id=RUN, round=0, stage=0, groups=groups, created_at=1.0)
    groups = decode(encode(batch), RolloutBatch).groups  # what a peer reads
    scored = [ScoredGroup("w1", g, tuple(float(i % 2) for i in range(len(g.completions)))) for g in groups]

    local = [workload._local_group(s).completion_ids for s in scored]
    external = [workload._external_group(s)[0].completion_ids for s in scored]

    assert external == local
    flat = [c for g in local for c in g]
    reasons = [r for g in groups for r in g.stop_reasons or []]
    assert len(reasons) == len(flat) == 12
    assert all(len(c) <= 8 for c in flat)  # the prefix counts against MAX_NEW_TOKENS on both sides
    assert all(c[: len(workload.prefix_ids)] == workload.prefix_ids for c in flat)
    cut = [c for c, r in zip(flat, reasons, strict=True) if r == "length"]
    stopped = [c for c, r in zip(flat, reasons, strict=True) if r == "eos"]
    assert cut and stopped, "the eos bias should make some completions stop and leave others at the cap"
    assert all(len(c) == 8 and eos not in c for c in cut)
    assert all(c[-1] == eos and c.count(eos) == 1 for c in stopped)
    assert all(g.tokenizer == workload.codec.fingerprint and None not in (g.token_ids or [None]) for g in groups)

    metrics = workload.train(StageContext("w1", 0, 0, 42), scored[:1], scored[1:])
    assert metrics["external/completions"] == 8.0 and metrics["external/sampled_ids"] == 8.0
    assert metrics["external/retokenized"] == 0.0 and metrics["external/ids_rejected"] == 0.0

    # A forger's copy: the same texts (so the same rewards) with other ids; and an older writer's, without ids.
    honest = groups[1]
    forged = honest.model_copy(
        update={"token_ids": [list(reversed(ids or [])) + [7] for ids in honest.token_ids or []]}
    )
    older = honest.model_copy(update={"stop_reasons": None, "tokenizer": None, "token_ids": None})
    rewards = scored[1].rewards
    bad = [ScoredGroup("w2", forged, rewards), ScoredGroup("w3", older, rewards)]
    trained = [workload._external_group(s)[0].completion_ids for s in bad]
    retokenized = [workload.codec.encode(t) for t in honest.completions]
    assert trained[0] == [
        workload.codec.finish(ids, r == "eos") for ids, r in zip(retokenized, honest.stop_reasons or [], strict=True)
    ]
    assert trained[1] == [ids[:8] for ids in retokenized]  # no stop reasons: never an eos
    metrics = workload.train(StageContext("w1", 0, 0, 42), scored[:1], bad)
    assert metrics["external/ids_rejected"] == 4.0 and metrics["external/retokenized"] == 8.0


def test_an_answer_prefix_that_fills_max_new_tokens_is_refused(tmp_path: Path, tiny_folder: Path) -> None:
    with pytest.raises(ValueError, match="MAX_NEW_TOKENS=1 leaves no room after the"):
        workload_for(tmp_path, tiny_folder, MAX_NEW_TOKENS="1")


def test_ids_are_not_shared_when_a_stage_s_could_overflow_a_rollout_file(tmp_path: Path, tiny_folder: Path) -> None:
    workload = workload_for(tmp_path, tiny_folder, NUM_TRAIN_SAMPLES="512", NUM_GENERATIONS="64", MAX_NEW_TOKENS="4096")
    assert not workload.share_ids
    assert workload_for(tmp_path, tiny_folder, NUM_GENERATIONS="64", MAX_NEW_TOKENS="4096").share_ids


def test_a_worst_case_batch_with_ids_fits_the_rollout_cap(tokenizer: Any) -> None:
    """I x G x MAX_NEW_TOKENS at the largest sizes that share ids, 6-digit ids and 16 384-char texts: under 32 MiB."""
    from swarm_gdrive.protocol.records import MAX_BYTES

    groups, g, tokens = 8, 64, MAX_COMPLETION_TOKENS  # 8 x 64 x 4096 x 7 bytes = 14.7 MB: half the cap at most
    group = RolloutGroup(
        group_id="r0-s0-g0",
        task="basic_arithmetic",
        question="q" * 2000,
        provenance=Provenance(dataset="basic_arithmetic", seed=7, index=3),
        completions=["x" * MAX_COMPLETION_CHARS] * g,
        rewards=[0.0] * g,
        stop_reasons=["length"] * g,
        tokenizer=FP,
        token_ids=[[151_643] * tokens] * g,
    )
    batch = RolloutBatch(node_id="w1", run_id=RUN, round=0, stage=0, groups=[group] * groups, created_at=1.0)
    size = len(encode(batch))
    assert size <= MAX_BYTES["rollouts"], size
    assert decode(encode(batch), RolloutBatch) == batch
