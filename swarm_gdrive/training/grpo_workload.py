"""The real workload: a task's questions, a model's batched completions, their reward, GRPO.

It implements :class:`swarm_gdrive.protocol.workload.Workload` for the worker loop: ``generate``
draws I questions of the task (:mod:`.task`: reasoning-gym or a dataset) seeded by (SEED, node, round, stage)
and samples G completions each; ``rescore`` regenerates another node's question from its provenance and scores its
completions with this node's :class:`~.reward_terms.Reward` (the peer's answers and rewards are never used), each on
exactly the text its training ids decode to (:mod:`.completions`: a tail past MAX_NEW_TOKENS buys nothing);
``train`` runs one GRPO update on the I + J groups; ``end_round`` checkpoints when due.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import MAX_BYTES, RolloutGroup, TaskEval, standard_error
from swarm_gdrive.protocol.sapo import ScoredGroup, rng_for
from swarm_gdrive.protocol.workload import StageContext
from swarm_gdrive.storage import Storage
from swarm_gdrive.storage.base import human_bytes
from swarm_gdrive.training import adapters, checkpoint, grpo, hub, twins
from swarm_gdrive.training.completions import CompletionCodec, Received, external_metrics
from swarm_gdrive.training.curriculum import curriculum_step
from swarm_gdrive.training.models import load_model_and_tokenizer, resolve_model
from swarm_gdrive.training.policy import (
    PolicyTrainer,
    TrainGroup,
    TrainSettings,
    peak_memory_mb,
    pick_device,
    pick_weight_dtype,
)
from swarm_gdrive.training.reward_terms import build_reward
from swarm_gdrive.training.rewards import ANSWER_OPEN
from swarm_gdrive.training.settings import TrainingSettings
from swarm_gdrive.training.task import build_task
from swarm_gdrive.training.task_check import read_chat_template
from swarm_gdrive.training.tasks import TaskBank, question_rng
from swarm_gdrive.training.threads import ThreadPlan

logger = logging.getLogger(__name__)

#: Of a rollout file's cap, what its token ids may take at most (the rest is for texts and the like).
IDS_SHARE_OF_CAP = 0.5


def settings_from(config: TrainingSettings) -> TrainSettings:
    """The trainer's settings from the node's configuration."""
    return TrainSettings(
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        learning_rate=config.learning_rate,
        weight_decay=config.weight_decay,
        warmup_steps=config.warmup_steps,
        max_grad_norm=config.max_grad_norm,
        micro_batch_size=config.micro_batch_size,
        gen_batch_size=config.gen_batch_size,
        num_iterations=config.num_iterations,
        scale_rewards=config.scale_rewards,
        precision=config.precision,
        loss=grpo.LossConfig(
            loss_type=config.loss_type,
            epsilon=config.epsilon,
            epsilon_high=config.epsilon_high,
            beta=config.beta,
            max_completion_length=config.max_new_tokens,
        ),
    )


def lora_settings(config: TrainingSettings) -> adapters.LoraSettings | None:
    """LORA_R and its companions; None for a full fine-tune (LORA_R=0)."""
    if config.lora_r <= 0:
        return None
    return adapters.LoraSettings(
        r=config.lora_r,
        alpha=config.lora_alpha,
        dropout=config.lora_dropout,
        target_modules=config.lora_target_modules,
    )


def _stats(prefix: str, values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        f"{prefix}_mean": statistics.fmean(values),
        f"{prefix}_std": statistics.pstdev(values),
        f"{prefix}_max": max(values),
    }


def stop_checkpoint_due(trained: int | None, saved: int | None, age_s: float | None, min_age_s: float) -> bool:
    """Whether a stopped worker checkpoints before it exits: it trained a round (``trained``) that its latest
    checkpoint (of round ``saved``, written ``age_s`` seconds ago; None: not by this process) does not hold, and
    that checkpoint is at least ``min_age_s`` (STOP_CHECKPOINT_MIN_SECONDS) old."""
    if trained is None or trained == saved:
        return False
    return age_s is None or age_s >= min_age_s


class GRPOWorkload:
    """GRPO + SAPO on a task (reasoning-gym's or a dataset) with one model on one device."""

    stateless = False  # a model, its optimizer and RNG states: checkpointed and resumed

    def __init__(self, config: TrainingSettings, storage: Storage, node_id: str, stop: threading.Event) -> None:
        self.config = config
        self.storage = storage
        self.node_id = node_id
        self.layout = Layout(config.experiment_name)
        self._stop = stop
        self.device = pick_device(config.device, config.cpu_only)
        self.threads = ThreadPlan(config.torch_threads, self.device)
        self.bank = build_task(config)  # the task provider (TASK_SOURCE)
        self.reward = build_reward(self.bank, config.format_reward_weight, config.reward_functions, config.gdrive_path)
        # Near-twins kept out of training and question spaces this run exhausts: logged once (training/twins.py).
        if isinstance(self.bank, TaskBank):
            draws = twins.expected_draws(
                self.bank, config.min_workers, config.max_rounds, config.num_train_samples, config.num_stages
            )
            self.splits = twins.split_report(self.bank, draws)
        else:
            total = max(config.min_workers, 1) * config.max_rounds * config.num_train_samples * config.num_stages
            self.splits = twins.log_splits([self.bank.split(total)])
        resolved = resolve_model(config.model_name, config.model_cache_dir)
        started = time.monotonic()
        token = config.huggingface_access_token
        self.lora = lora_settings(config)
        self.weight_dtype = adapters.DTYPES[pick_weight_dtype(config.weight_dtype, self.device, self.lora is not None)]
        model, tokenizer = load_model_and_tokenizer(resolved.source, self.device, self.weight_dtype, token)
        if config.chat_template:
            tokenizer.chat_template = read_chat_template(config.chat_template, config.gdrive_path)
        if config.gradient_checkpointing:
            adapters.enable_gradient_checkpointing(model)
        if self.lora is not None:
            model = adapters.apply_lora(model, self.lora, base_name=config.model_name)
        reference = None
        if config.beta > 0 and self.lora is None:  # with LoRA the reference is the model, adapters disabled
            reference, _ = load_model_and_tokenizer(resolved.source, self.device, self.weight_dtype, token)
            reference.eval().requires_grad_(False)
        self.trainer = PolicyTrainer(model, tokenizer, settings_from(config), self.device, reference)
        plan = adapters.trainable_summary(model)
        logger.info(
            "loaded %s (%s, %.1fM parameters, weights %s) on %s in %.1f s; training %s: %.2fM parameters, their "
            "AdamW state %s (2 tensors each); autocast %s; gradient checkpointing %s",
            config.model_name,
            resolved.kind,
            plan["parameters"] / 1e6,
            plan["weights"],
            self.device,
            time.monotonic() - started,
            f"LoRA adapters (r={self.lora.r}, {self.lora.target_modules})" if self.lora else "every weight",
            plan["trainable"] / 1e6,
            plan["trained_dtype"],
            self.trainer.precision,
            "on" if config.gradient_checkpointing else "off",
        )
        self.prefix = ANSWER_OPEN if config.answer_prefix else ""
        self.prefix_ids: list[int] = (
            tokenizer(self.prefix, add_special_tokens=False)["input_ids"] if self.prefix else []
        )
        if len(self.prefix_ids) >= config.max_new_tokens:
            raise ValueError(
                f"MAX_NEW_TOKENS={config.max_new_tokens} leaves no room after the {len(self.prefix_ids)} tokens of "
                f"the answer prefix {self.prefix!r}, which count against it: raise MAX_NEW_TOKENS or set "
                "ANSWER_PREFIX=false"
            )
        self.codec = CompletionCodec(tokenizer, self.trainer.eos_ids, config.max_new_tokens)
        self.share_ids = self._ids_fit(config)
        self._local_ids: dict[str, tuple[list[int], list[list[int]]]] = {}
        self._said_cut: tuple[int, set[str]] = (-1, set())  # (round, peers) whose cut completions were logged
        self._generation: dict[str, float] = {}
        self._last_checkpoint: int | None = None
        self._said_weights_alone = False
        self._checkpointed_at = time.monotonic()  # the model is the one loaded (or restored) until it trains
        self._saved_at: float | None = None  # when this process last wrote a checkpoint (monotonic)
        self._trained_round: int | None = None  # the last round trained whole (its last stage done: end_round)
        self._in_part: tuple[int, int] | None = None  # (round, stages) updated since its end_round: a partial round
        self.restored_digest: str | None = None
        self.trained_or_restored = False
        self._last_push: int | None = None

    # -- Workload --------------------------------------------------------------------------

    def generate(self, ctx: StageContext) -> Iterator[RolloutGroup]:
        self.threads.update()  # a worker that started or stopped beside this one since the last round
        questions = self.bank.draw(
            self.config.num_train_samples, question_rng(ctx.seed, ctx.node_id, ctx.round, ctx.stage)
        )
        prefix, prefix_ids = self.prefix, self.prefix_ids
        messages = [self.bank.messages(q.question) for q in questions]
        bare = [self.trainer.prompt_ids(m) for m in messages]  # what is trained on
        # Generation tokenizes the prompt with the prefix attached (not bare + prefix_ids: the boundary may merge).
        prompts = [self.trainer.prompt_ids(m, prefix) for m in messages] if prefix else bare
        seed = rng_for(ctx.seed, ctx.node_id, ctx.round, ctx.stage, purpose="sampling").randrange(2**31)
        # The prefix is part of the completion, so it counts against MAX_NEW_TOKENS as for an external one.
        budget = self.config.max_new_tokens - len(prefix_ids)
        gen = self.trainer.generate(prompts, self.config.num_generations, seed, max_new_tokens=budget)
        self._generation = {
            "gen/seconds": gen.seconds,
            "gen/new_tokens": float(gen.new_tokens),
            "gen/tokens_per_s": gen.new_tokens / gen.seconds if gen.seconds > 0 else 0.0,
            "gen/peak_memory_mb": peak_memory_mb(self.device),
        }
        self._local_ids = {}
        for i, (question, prompt, generated, ids) in enumerate(
            zip(questions, bare, gen.texts, gen.token_ids, strict=True)
        ):
            group_id = f"r{ctx.round}-s{ctx.stage}-g{i}"
            # A forced prefix is part of the completion that is shared, scored and trained on.
            out = [self.codec.outgoing(prefix, prefix_ids, c, text) for c, text in zip(ids, generated, strict=True)]
            texts = [o.text for o in out]
            self._local_ids[group_id] = (prompt, [prefix_ids + c for c in ids])
            yield RolloutGroup(
                group_id=group_id,
                task=question.task,
                question=question.question,
                provenance=question.provenance,
                completions=texts,
                rewards=list(self._score(question.entry, texts)),
                stop_reasons=[o.stop_reason for o in out],
                tokenizer=self.codec.fingerprint if self.share_ids else None,
                token_ids=[o.token_ids for o in out] if self.share_ids else None,
            )

    def _ids_fit(self, config: TrainingSettings) -> bool:
        """Whether a stage's sampled ids fit in half a rollout file's cap, at worst (I x G x MAX_NEW_TOKENS ids of
        the longest id's digits and a comma); beyond it they are not shared, and peers re-tokenize the texts."""
        per_id = len(str(max(self.codec.vocab_size - 1, 0))) + 1
        worst = config.num_train_samples * config.num_generations * config.max_new_tokens * per_id
        fits = worst <= MAX_BYTES["rollouts"] * IDS_SHARE_OF_CAP
        if not fits:
            logger.warning(
                "sampled token ids are not shared: up to %d bytes of them a stage (NUM_TRAIN_SAMPLES x NUM_GENERATIONS"
                " x MAX_NEW_TOKENS) would not leave room for the texts in a %d-byte rollout file",
                worst,
                MAX_BYTES["rollouts"],
            )
        return fits

    def rescore(self, ctx: StageContext, group: RolloutGroup) -> tuple[float, ...] | None:
        """Another node's group scored here, each completion on the text of the ids it will be trained on
        (:meth:`_received`, as :meth:`_external_group` trains it), not on the text as sent; None: provenance fails."""
        entry = self.bank.regenerate(group)
        if entry is None:
            return None
        return self._score(entry, [r.text for r in self._received(group)])

    def _score(self, entry: dict[str, Any], completions: list[str]) -> tuple[float, ...]:
        return self.reward.score(entry, completions)

    def train(self, ctx: StageContext, local: list[ScoredGroup], external: list[ScoredGroup]) -> dict[str, float]:
        outside = [self._external_group(g) for g in external]
        groups = [self._local_group(g) for g in local] + [group for group, _ in outside]
        metrics = self.trainer.step(groups)
        self._in_part = (ctx.round, ctx.stage + 1)
        metrics.update(external_metrics([r for _, received in outside for r in received]))
        self._say_cut(ctx.round, external, [received for _, received in outside])
        local_rewards = [r for g in local for r in g.rewards]
        external_rewards = [r for g in external for r in g.rewards]
        lengths = [len(c) for g in groups for c in g.completion_ids]
        metrics.update(self._generation)
        metrics.update(_stats("reward/local", local_rewards))
        metrics.update(_stats("reward/external", external_rewards))
        metrics.update(
            {
                "reward/local_accuracy": sum(r >= 1.0 for r in local_rewards) / max(len(local_rewards), 1),
                "reward/local_zero_variance_fraction": sum(not g.has_variance for g in local) / max(len(local), 1),
                "completion/length_mean": statistics.fmean(lengths) if lengths else 0.0,
                "completion/length_max": float(max(lengths, default=0)),
            }
        )
        return metrics

    def _say_cut(self, round_: int, external: list[ScoredGroup], received: list[list[Received]]) -> None:
        """Log, once per peer and round, that a peer's completions ran past MAX_NEW_TOKENS (``external/cut_to_cap``
        counts them): a peer with a larger cap, or one whose tail past the cap was never going to be scored."""
        cut: dict[str, int] = {}
        for scored, got in zip(external, received, strict=True):
            cut[scored.source] = cut.get(scored.source, 0) + sum(r.cut for r in got)
        if self._said_cut[0] != round_:
            self._said_cut = (round_, set())
        for source, n in sorted(cut.items()):
            if n and source not in self._said_cut[1]:
                self._said_cut[1].add(source)
                logger.info(
                    "round %d: %d completion(s) of %s ran past MAX_NEW_TOKENS=%d; each is trained on its first %d "
                    "tokens and scored on their text alone",
                    round_,
                    n,
                    source,
                    self.config.max_new_tokens,
                    self.config.max_new_tokens,
                )

    def _local_group(self, scored: ScoredGroup) -> TrainGroup:
        prompt, ids = self._local_ids[scored.group.group_id]
        return TrainGroup(prompt, ids, list(scored.rewards))

    def _external_group(self, scored: ScoredGroup) -> tuple[TrainGroup, list[Received]]:
        """Another node's group, on its sampled ids where they are usable (:mod:`.completions`), and how each
        completion's ids were obtained. Its rewards are :meth:`rescore`'s, of the same ids' text."""
        group = scored.group
        prompt = self.trainer.prompt_ids(self.bank.messages(group.question))
        received = self._received(group)
        return TrainGroup(prompt, [r.ids for r in received], list(scored.rewards)), received

    def _received(self, group: RolloutGroup) -> list[Received]:
        """Each completion of another node's group as it is trained: its ids and the text they decode to, the one
        text it is scored on (:meth:`CompletionCodec.incoming`; deterministic, so rescore and train agree)."""
        n = len(group.completions)
        reasons = group.stop_reasons or [None] * n
        sampled = group.token_ids or [None] * n
        return [
            self.codec.incoming(text, reason, ids, group.tokenizer)
            for text, reason, ids in zip(group.completions, reasons, sampled, strict=True)
        ]

    # -- evaluation ------------------------------------------------------------------------

    def evaluate(self, round_: int) -> list[TaskEval]:
        """Greedy pass@1 (and sampled pass@k) on each task's held-out set; then the curriculum's step.

        The fixed set (level 0) is the same on every node and over time; a task above level 0 is
        also evaluated at its current level, which is what the curriculum's threshold is judged on.
        """
        results: list[TaskEval] = []
        accuracy_at_level: dict[str, float] = {}
        prefix = ANSWER_OPEN if self.config.answer_prefix else ""
        sets = [
            (task, level, self.bank.eval_questions(task, self.config.eval_samples, level))
            for task in self.bank.tasks
            for level in sorted({0, self.bank.current_level[task]})
        ]
        prompts = [[self.trainer.prompt_ids(self.bank.messages(q.question), prefix) for q in qs] for _, _, qs in sets]
        # Every task's questions in as few calls as GEN_BATCH_SIZE allows: greedy completions depend on the prompt
        # alone, and a batch decodes them all in one step where a call per task would take a step each.
        names = ", ".join(dict.fromkeys(task for task, _, _ in sets))
        greedy = self.trainer.generate(
            [p for ps in prompts for p in ps], 1, seed=0, greedy=True, label=f"evaluate {names} (greedy)"
        )
        start = 0
        for (task, level, questions), task_prompts in zip(sets, prompts, strict=True):
            texts = [t[0] for t in greedy.texts[start : start + len(questions)]]
            start += len(questions)
            result = self._evaluate_task(task, level, round_, questions, task_prompts, texts)
            results.append(result)
            accuracy_at_level[task] = result.pass1  # the last one is the current level
        if self.config.curriculum_threshold > 0:
            top = {t: len(self.bank.levels[t]) - 1 for t in self.bank.tasks}
            new = curriculum_step(self.bank.current_level, accuracy_at_level, self.config.curriculum_threshold, top)
            for task, level in new.items():
                if level != self.bank.current_level[task]:
                    logger.info(
                        "curriculum: %s up to level %d (held-out pass@1 %.2f)", task, level, accuracy_at_level[task]
                    )
                    self.bank.set_level(task, level)
        return results

    def _evaluate_task(
        self, task: str, level: int, round_: int, questions: list[Any], prompts: list[list[int]], greedy: list[str]
    ) -> TaskEval:
        """One task's held-out scores from its greedy completions, and its sampled pass@k when EVAL_PASS_K > 0."""
        prefix = ANSWER_OPEN if self.config.answer_prefix else ""
        scores = [self.bank.correctness(q.entry, prefix + text) for q, text in zip(questions, greedy, strict=True)]
        k = self.config.eval_pass_k
        pass_k = pass_k_se = None
        if k > 0:
            seed = rng_for(self.config.seed, self.node_id, round_, 0, purpose=f"eval-{task}").randrange(2**31)
            sampled = self.trainer.generate(prompts, k, seed, label=f"evaluate {task} (pass@{k})")
            hits = [
                any(self.bank.correctness(q.entry, prefix + t) >= 1.0 for t in texts)
                for q, texts in zip(questions, sampled.texts, strict=True)
            ]
            pass_k = sum(hits) / len(hits)
            pass_k_se = standard_error([float(h) for h in hits])
        passed = [float(s >= 1.0) for s in scores]
        return TaskEval(
            task=task,
            level=level,
            n=len(questions),
            pass1=statistics.fmean(passed),
            mean_score=statistics.fmean(scores),
            k=k,
            pass_k=pass_k,
            pass1_se=standard_error(passed),
            mean_score_se=standard_error(scores),
            pass_k_se=pass_k_se,
        )

    # -- checkpoints -----------------------------------------------------------------------

    def resume(self) -> int | None:
        """Load this node's latest valid checkpoint, if any; returns its round."""
        into = Path(self.config.local_dir) / "restore" / self.config.experiment_name / self.node_id
        before: int | None = None
        limits = checkpoint.size_limits(self.trainer.model)  # what a checkpoint of this model can take
        while True:
            restored = checkpoint.load_latest(
                self.storage, self.layout, self.node_id, into, before=before, limits=limits
            )
            if restored is None:
                return None
            try:
                round_ = self._load(restored)
                break
            except adapters.SettingsMismatchError:
                raise  # every older checkpoint has the same settings: the user must choose, not lose them
            except Exception as exc:  # noqa: BLE001 - a checkpoint that does not load: try the one before
                logger.warning(
                    "checkpoint of round %d does not load (%s: %s); trying an older one",
                    restored.round,
                    type(exc).__name__,
                    exc,
                )
                before = restored.round
        for task, level in checkpoint.read_extra(restored.folder).get("curriculum", {}).items():
            if task in self.bank.current_level and isinstance(level, int):
                self.bank.set_level(task, min(level, len(self.bank.levels[task]) - 1))
        self._last_checkpoint = round_
        self.trained_or_restored = True
        self.restored_digest = checkpoint.param_digest(self.trainer.model)
        logger.info("resumed from checkpoint of round %d (parameters %s)", round_, self.restored_digest)
        return round_

    def _load(self, restored: checkpoint.Restored) -> int:
        """The restored weights (or adapters) and training state into the trainer; SettingsMismatchError when
        the checkpoint holds adapters and LoRA is off now, or the other way round, or other LoRA settings."""
        from transformers import AutoModelForCausalLM

        has_adapters = (restored.folder / adapters.ADAPTER_WEIGHTS).exists()
        if has_adapters != (self.lora is not None):
            raise adapters.SettingsMismatchError(
                f"the checkpoint of round {restored.round} holds "
                + (
                    "LoRA adapters, but LORA_R=0 now: set LORA_R, LORA_ALPHA and LORA_TARGET_MODULES as trained"
                    if has_adapters
                    else f"every weight (a full fine-tune), but LORA_R={self.config.lora_r} now: set LORA_R=0"
                )
                + " to resume, or give this node another NODE_ID to start afresh"
            )
        if self.lora is not None:
            adapters.load_adapters(self.trainer.model, restored.folder, self.lora)
        else:
            saved = AutoModelForCausalLM.from_pretrained(restored.folder, dtype=self.weight_dtype, use_safetensors=True)
            self.trainer.model.load_state_dict(saved.state_dict())
        round_ = checkpoint.restore_training_state(restored.folder, self.trainer.optimizer)
        for group in self.trainer.optimizer.param_groups:  # WEIGHT_DECAY as configured now, not as saved
            group["weight_decay"] = self.config.weight_decay
        self.trainer.set_lr()  # LEARNING_RATE as configured now, at the restored step of its warmup
        return round_

    def end_round(self, round_: int, final: bool) -> dict[str, float]:
        """Checkpoint every CHECKPOINT_INTERVAL rounds, when CHECKPOINT_MINUTES have passed since the
        last one, and at the end; push to the Hub when due.

        Nothing is saved or pushed by a process that neither trained nor restored a model: its
        weights would be the untrained ones, mislabelled with the round.
        """
        metrics: dict[str, float] = {}
        if not final:
            self.trained_or_restored = True
            self._trained_round = round_  # every stage of it trained: a stop checkpoint may bear it
            self._in_part = None
        if not self.trained_or_restored:
            return metrics
        minutes = self.config.checkpoint_minutes
        overdue = minutes > 0 and time.monotonic() - self._checkpointed_at >= minutes * 60
        interval = self.config.checkpoint_interval
        due = (interval > 0 and (round_ + 1) % interval == 0) or overdue or final
        if due and self._last_checkpoint != round_:
            started = time.monotonic()
            self._save(round_)
            metrics["checkpoint/seconds"] = time.monotonic() - started
        token = self.config.huggingface_access_token
        due_push = (round_ + 1) % self.config.hub_push_interval == 0 or final
        if token and due_push and self._last_push != round_:
            self._last_push = round_
            metrics["hub/pushed"] = float(
                hub.push(
                    self.trainer.model,
                    self.trainer.tokenizer,
                    token,
                    self.config.hub_repo_id,
                    self.config.experiment_name,
                    self.node_id,
                    round_,
                )
            )
        return metrics

    def checkpoint_on_stop(self) -> int | None:
        """Before a stopped worker exits: a checkpoint of the last round trained whole (:func:`stop_checkpoint_due`);
        none while a round is trained in part (a stop between stages: the weights hold part of it, which no
        checkpoint's round can label; the worker does not ask then)."""
        if self._in_part is not None:
            logger.warning(
                "stopping: no checkpoint of round %d, trained in part (%d of %d stages)",
                self._in_part[0],
                self._in_part[1],
                self.config.num_stages,
            )
            return None
        age = None if self._saved_at is None else time.monotonic() - self._saved_at
        round_ = self._trained_round
        if not stop_checkpoint_due(round_, self._last_checkpoint, age, self.config.stop_checkpoint_min_seconds):
            if round_ is not None and round_ != self._last_checkpoint:
                logger.info(
                    "stopping: round %d not checkpointed, the checkpoint of round %s is %.0f s old "
                    "(younger than STOP_CHECKPOINT_MIN_SECONDS=%g)",
                    round_,
                    self._last_checkpoint,
                    age or 0.0,
                    self.config.stop_checkpoint_min_seconds,
                )
            return None
        assert round_ is not None
        logger.info("stopping: saving a checkpoint of round %d first (the stop button again interrupts it)", round_)
        self._save(round_)
        return round_

    def _save(self, round_: int) -> None:
        """A checkpoint of ``round_`` in the shared folder; the older ones beyond KEEP_CHECKPOINTS pruned."""
        checkpoint.save(
            self.storage,
            self.layout,
            self.node_id,
            round_,
            self.trainer.model,
            self.trainer.tokenizer,
            self.trainer.optimizer,
            self.config.keep_checkpoints,
            extra={"curriculum": dict(self.bank.current_level)},
            optimizer_state=self._optimizer_state(),
        )
        self._last_checkpoint = round_
        self._checkpointed_at = self._saved_at = time.monotonic()

    def _optimizer_state(self) -> str:
        """CHECKPOINT_OPTIMIZER resolved for this model (checkpoint.resolve_optimizer_state); auto's choice of the
        weights alone is logged at the first save."""
        trained = sum(p.numel() for p in self.trainer.model.parameters() if p.requires_grad)
        state = checkpoint.resolve_optimizer_state(self.config.checkpoint_optimizer, self.lora is not None, trained)
        if state == "none" and self.config.checkpoint_optimizer == "auto" and not self._said_weights_alone:
            self._said_weights_alone = True
            logger.info(
                "checkpoints hold the weights alone: AdamW's moments of %s trained weights would add %s to each "
                "(CHECKPOINT_OPTIMIZER=auto); a resume starts AdamW afresh. CHECKPOINT_OPTIMIZER=bf16 keeps them",
                f"{trained:,}",
                human_bytes(4 * trained),
            )
        return state

    def close(self) -> None:
        self._local_ids.clear()

    @property
    def model(self) -> Any:
        return self.trainer.model
