"""A Hugging Face dataset as a task (TASK_SOURCE=datasets): questions and reference answers from columns, answers
checked with math-verify, as numbers, or as text.

Each node reads its own copy (DATASET_PATH: a .json/.jsonl/.csv/.parquet file, a ``save_to_disk`` folder, a folder
of data files, or a Hub id when online), never the shared folder, and at most :data:`MAX_DATASET_BYTES` of files.
The first DATASET_MAX_ROWS rows are the task; their content hash (:func:`dataset_fingerprint`) is in every
question's provenance and in experiment.json, so nodes whose copies differ do not train together.

The split: the rows in an order shuffled by SEED; the first EVAL_SAMPLES distinct questions (by
:func:`~swarm_gdrive.training.twins.normalise_question`) are held out, and every row whose question has the text of
a held-out one is never drawn for training nor accepted from a peer. A peer's group is scored only against this
node's own row at the provenance's index, after its question text matched.

The reference answer of GSM8K's ``"... #### 72"`` is ``72`` (:func:`reference_answer`). A completion's answer is
:func:`~swarm_gdrive.training.rewards.extract_answer`'s (ANSWER_EXTRACTION), then :func:`check_answer`. Peers'
answers are hostile text and math-verify parses and simplifies with sympy, where a short text can take hours or
all memory (``9^{9^{9}}``, ``\\binom{10^9}{10^8}``, deep fractions, ``(x+y+z)^{99}``). So an answer reaches it only
past :func:`safe_for_math`, a whitelist (characters, LaTeX commands, length, nesting, digit runs, short literal
exponents, no ``a^b^c``), which bounds every integer it can build; symbolic work within it is cut by running
math-verify in a process of its own, killed after :data:`MATH_TIMEOUT_SECONDS` (:class:`_MathChecker`).

Measured (2-core CPU): ``import math_verify`` 0.7 s (sympy), loaded once a worker checks its first non-numeric
answer; numbers on both sides are compared without it.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.util
import json
import logging
import random
import re
import select
import subprocess
import sys
import threading
from fractions import Fraction
from pathlib import Path
from typing import Any

from swarm_gdrive.protocol.records import Provenance, RolloutGroup
from swarm_gdrive.storage.settings import inside_shared_folder
from swarm_gdrive.training import rewards
from swarm_gdrive.training.settings import ANSWER_CHECKS
from swarm_gdrive.training.tasks import Question, QuestionSpaceTooSmall, build_messages
from swarm_gdrive.training.twins import TaskSplit, normalise_question

logger = logging.getLogger(__name__)

#: The task name of a dataset's questions (a group's ``task``, its provenance's ``dataset``).
TASK_NAME = "dataset"
#: The most bytes of files DATASET_PATH may name (a file, or every file under a folder).
MAX_DATASET_BYTES = 2 * 1024**3
#: Longest answer a check looks at; a longer one scores 0.0.
ANSWER_CHAR_LIMIT = 256
#: The file suffixes read as data files, and the `datasets` builder of each.
BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}

_NUMBER = re.compile(r"[-+]?\d{1,30}(?:\.\d{1,30})?|[-+]?\d{1,30}/\d{1,30}")

#: What a peer's answer may hold to reach math-verify (sympy), a whitelist: sympy's parser and simplifier can take
#: minutes or all memory on a short text (a tower of powers, a product or binomial of huge bounds, deeply nested
#: fractions), and a timeout would make nodes disagree, so the text is bounded instead. Longest text, deepest
#: nesting of brackets, longest digit run, most powers; an exponent is a literal of at most 2 characters (``x^2``,
#: ``10^{-3}``) that no second ``^`` follows; the only LaTeX commands are those of answers (fractions, roots,
#: constants, relations, spacing, text), never sums, products, binomials, factorials, floors, integrals or limits.
MATH_CHAR_LIMIT = 96
MATH_DEPTH_LIMIT = 4
_MATH_CHARS = re.compile(r"[0-9A-Za-z \t+\-*/^_.,()\[\]{}\\$=<>|:;%']*")
_MATH_COMMANDS = frozenset(
    {
        "frac",
        "dfrac",
        "tfrac",
        "sqrt",
        "pi",
        "cdot",
        "times",
        "div",
        "pm",
        "mp",
        "left",
        "right",
        "circ",
        "degree",
        "infty",
        "le",
        "ge",
        "leq",
        "geq",
        "neq",
        "ne",
        "approx",
        "text",
        "textbf",
        "mathrm",
        "mathbf",
        "boxed",
        "alpha",
        "beta",
        "gamma",
        "delta",
        "theta",
        "lambda",
        "mu",
        "sigma",
        "phi",
        "omega",
        "sin",
        "cos",
        "tan",
        "cot",
        "sec",
        "csc",
        "log",
        "ln",
        "exp",
        "cup",
        "cap",
        "emptyset",
        "varnothing",
        "in",
        "notin",
        "dots",
        "ldots",
        "cdots",
        "quad",
        "qquad",
        "%",
        ",",
        ";",
        "!",
        ":",
        "{",
        "}",
        "$",
    }
)
_COMMAND = re.compile(r"\\([A-Za-z]+|.)")
_EXPONENT = re.compile(r"(?:\^|\*\*)\s*(\{\s*[-+]?[0-9A-Za-z]{1,2}\s*\}|[-+]?[0-9A-Za-z]{1,2}\b|[0-9A-Za-z])")
_DIGITS = re.compile(r"\d{13,}")


def safe_for_math(answer: str) -> bool:
    """Whether a peer's ``answer`` is within what math-verify parses and verifies fast (:data:`_MATH_CHARS` ...)."""
    if len(answer) > MATH_CHAR_LIMIT or not _MATH_CHARS.fullmatch(answer) or _DIGITS.search(answer):
        return False
    if any(m.group(1) not in _MATH_COMMANDS for m in _COMMAND.finditer(answer)):
        return False
    depth = 0
    for ch in answer:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth > MATH_DEPTH_LIMIT:
            return False
    powers = answer.count("^") + answer.count("**")
    if powers > 2:
        return False
    exponents = list(_EXPONENT.finditer(answer))
    if len(exponents) != powers:  # an exponent that is not a short literal: (10^{10}), {x+1}, 10^{100}, ...
        return False
    return not any(answer[m.end() :].lstrip().startswith(("^", "**")) for m in exponents)  # no a^b^c


def reference_answer(text: str) -> str:
    """The answer of a reference solution: what follows GSM8K's last ``####``, else the whole text, stripped."""
    _, sep, tail = text.rpartition("####")
    return (tail if sep else text).strip()


def _number(text: str) -> Fraction | None:
    """``text`` as an exact number when it is one (commas, ``$``, a trailing ``.`` and spaces ignored), else None."""
    cleaned = text.strip().replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    if not _NUMBER.fullmatch(cleaned):
        return None
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def _close(a: Fraction, b: Fraction) -> bool:
    return abs(a - b) <= Fraction(1, 10**6) * max(1, abs(b))


#: Seconds one math-verify check (both parses and the comparison) may take before its process is killed (0.0).
MATH_TIMEOUT_SECONDS = 2.0
#: Seconds a new checking process may take to start and import math-verify (sympy).
MATH_START_SECONDS = 120.0


class _MathChecker:
    """math-verify in a process of its own, the same on every node and thread (a notebook runs its node in a
    thread, where SIGALRM timeouts do not work): a check that outlasts :data:`MATH_TIMEOUT_SECONDS` (sympy's
    simplification of ``(x+y+z)^{99}``, which :func:`safe_for_math` lets through) kills the process and scores 0.0;
    the next check starts a new one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None

    def check(self, reference: str, answer: str) -> float:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            try:
                self._proc.stdin.write(json.dumps([reference, answer]) + "\n")
                self._proc.stdin.flush()
                line = self._read(MATH_TIMEOUT_SECONDS)
            except OSError:  # the process died (killed from outside): the next check starts another
                line = None
            if line is not None:
                try:
                    return 1.0 if float(line) == 1.0 else 0.0
                except ValueError:
                    pass
            logger.warning("math-verify took over %g s on answer %.80r: scored 0.0", MATH_TIMEOUT_SECONDS, answer)
            self._stop()
            return 0.0

    def _start(self) -> None:
        # -P (3.11+): the working directory is not put first on the child's sys.path, so that a math_verify.py or
        # sympy.py beside a node started from some folder (even the shared one) is never imported; before 3.11 the
        # child starts in the folder the package is imported from, which is on its path already. (procs.SAFE_PATH,
        # the nodes' same flag, sits on the entry-point floor, which training may not import.)
        safe = ["-P"] if sys.version_info >= (3, 11) else []
        self._proc = subprocess.Popen(
            [sys.executable, *safe, "-m", "swarm_gdrive.training.math_child"],
            cwd=None if safe else str(Path(__file__).resolve().parents[2]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        if self._read(MATH_START_SECONDS) != "ready":
            self._stop()
            raise RuntimeError(
                f"math-verify's checking process did not start within {MATH_START_SECONDS:g} s (is it installed? "
                "pip install 'swarm-gdrive[datasets]')"
            )

    def _read(self, timeout: float) -> str | None:
        """The child's next line, or None when it writes none within ``timeout`` seconds."""
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout)
        return self._proc.stdout.readline().strip() if ready else None

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                pipe.close()
        self._proc = None


_MATH = _MathChecker()


def check_answer(answer: str | None, reference: str, mode: str = "math") -> float:
    """1.0 when ``answer`` equals the reference under DATASET_ANSWER_CHECK ``mode``, else 0.0 (never raises).

    exact: the texts, whitespace runs collapsed; numeric: both numbers, within 1e-6 relative; math: numbers as
    numeric, anything else by ``math_verify.verify`` (1/2, 0.5 and ``\\frac{1}{2}`` agree), screened first.
    """
    if mode not in ANSWER_CHECKS:
        raise ValueError(f"answer check {mode!r} is not one of {ANSWER_CHECKS}")
    if answer is None or not answer.strip() or len(answer) > ANSWER_CHAR_LIMIT:
        return 0.0
    if mode == "exact":
        return float(" ".join(answer.split()) == " ".join(reference.split()))
    a, r = _number(answer), _number(reference)
    if a is not None and r is not None:
        return float(_close(a, r))
    if mode == "numeric" or not safe_for_math(answer):
        return 0.0
    return _MATH.check(reference, answer)


def dataset_fingerprint(rows: list[dict[str, Any]], question_column: str, answer_column: str, check: str) -> str:
    """sha256 (16 hex digits) of the rows used (every column, canonical JSON, in order), the question and answer
    columns and the answer check: what every node of an experiment must share."""
    digest = hashlib.sha256(json.dumps([question_column, answer_column, check]).encode())
    for row in rows:
        digest.update(json.dumps(row, sort_keys=True, default=str, ensure_ascii=False).encode())
        digest.update(b"\n")
    return digest.hexdigest()[:16]


def _size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _load(path: str, name: str | None, split: str, cache_dir: str | None) -> Any:
    """A `datasets.Dataset` from a local file or folder, or from the Hub."""
    try:
        import datasets
    except ImportError:
        raise ValueError(
            "TASK_SOURCE=datasets needs the datasets extra on this node: pip install 'swarm-gdrive[datasets]'"
        ) from None

    local = Path(path).expanduser()
    if local.is_file():
        builder = BUILDERS.get(local.suffix.lower())
        if builder is None:
            kind = local.suffix or "suffix-less"
            raise ValueError(f"DATASET_PATH={path!r}: a {kind} file; use {', '.join(BUILDERS)}")
        return datasets.load_dataset(builder, data_files=str(local), split="train", cache_dir=cache_dir)
    if local.is_dir():
        if any((local / marker).exists() for marker in ("dataset_dict.json", "dataset_info.json", "state.json")):
            saved = datasets.load_from_disk(str(local))
            if isinstance(saved, datasets.DatasetDict):
                if split not in saved:
                    raise ValueError(f"DATASET_SPLIT={split!r}: {path} has the splits {', '.join(saved)}")
                return saved[split]
            return saved
        return datasets.load_dataset(str(local), name, split=split, cache_dir=cache_dir)
    try:
        return datasets.load_dataset(path, name, split=split, cache_dir=cache_dir)
    except Exception as exc:
        raise ValueError(
            f"DATASET_PATH={path!r} is not a local file or folder, and the Hub did not give it "
            f"({type(exc).__name__}: {str(exc)[:200]}); give a local copy, or a Hub id with network "
            "(HF_HUB_OFFLINE unset)"
        ) from None


def cache_dir(local_dir: str) -> str:
    """Where `datasets` keeps what it converts of a node's dataset: under SWARM_LOCAL_DIR, node-local."""
    return str(Path(local_dir) / "datasets-cache")


@functools.lru_cache(maxsize=4)
def load_rows(
    path: str, name: str | None, split: str, max_rows: int, gdrive_path: str, cache_dir: str | None = None
) -> tuple[dict[str, Any], ...]:
    """The first ``max_rows`` rows of DATASET_PATH as dicts (read once per process and arguments); ValueError names
    the setting when the path is inside GDRIVE_PATH, its files exceed :data:`MAX_DATASET_BYTES`, or it cannot load."""
    local = Path(path).expanduser()
    if local.exists():
        if inside_shared_folder(str(local), gdrive_path):
            raise ValueError(
                f"DATASET_PATH={path!r} is inside the shared folder GDRIVE_PATH={gdrive_path!r}, where every "
                "participant can write: each node reads its own copy; put it outside GDRIVE_PATH"
            )
        size = _size_of(local)
        if size > MAX_DATASET_BYTES:
            raise ValueError(
                f"DATASET_PATH={path!r} holds {size:,} bytes, over the {MAX_DATASET_BYTES:,}-byte cap: keep the "
                "rows you train on in a smaller file"
            )
    dataset = _load(path, name, split, cache_dir)
    n = min(len(dataset), max_rows)
    return tuple(dataset.select(range(n)).to_list())


class DatasetTask:
    """A dataset's rows as a :class:`~swarm_gdrive.training.task.TaskProvider` of one task, :data:`TASK_NAME`."""

    def __init__(
        self,
        rows: list[dict[str, Any]] | tuple[dict[str, Any], ...],
        seed: int,
        question_column: str = "question",
        answer_column: str = "answer",
        answer_check: str = "math",
        held_out: int = 16,
        extraction: str = "strict",
        system_prompt: str | None = None,
    ) -> None:
        if answer_check not in ANSWER_CHECKS:
            raise ValueError(f"DATASET_ANSWER_CHECK={answer_check!r}: use one of {', '.join(ANSWER_CHECKS)}")
        rewards.check_extraction(extraction)
        if not rows:
            raise ValueError("DATASET_PATH: the dataset has no rows")
        for var, column in (("DATASET_QUESTION_COLUMN", question_column), ("DATASET_ANSWER_COLUMN", answer_column)):
            if column not in rows[0]:
                raise ValueError(f"{var}={column!r}: the dataset has no such column; its columns: {', '.join(rows[0])}")
        self.rows = list(rows)
        self.seed = seed
        self.question_column, self.answer_column = question_column, answer_column
        self.answer_check, self.extraction, self.held_out = answer_check, extraction, held_out
        self.system_prompt = system_prompt
        self.fingerprint = dataset_fingerprint(self.rows, question_column, answer_column, answer_check)
        self.tasks = (TASK_NAME,)
        self.levels: dict[str, list[dict[str, Any]]] = {TASK_NAME: [{}]}
        self.current_level = {TASK_NAME: 0}
        self._questions = [str(row[question_column]) for row in self.rows]
        keys = [normalise_question(q) for q in self._questions]  # each question normalised once
        order = list(range(len(self.rows)))
        random.Random(f"held-out:{seed}").shuffle(order)
        held: dict[str, int] = {}
        for i in order:
            key = keys[i]
            if key not in held:
                held[key] = i
                if len(held) == held_out:
                    break
        self._held_keys = frozenset(held)
        self._held = list(held.values())
        #: held-out questions that another row asks in other words (the same once normalised): kept out too
        held_texts = {self._questions[i] for i in self._held}
        reworded = {key for q, key in zip(self._questions, keys, strict=True) if q not in held_texts}
        self.near_twins = len(reworded & self._held_keys)
        self._train = [i for i, key in enumerate(keys) if key not in held]
        self._train_keys = frozenset(keys[i] for i in self._train)
        distinct = len(self._train_keys)
        if len(held) < held_out or distinct < held_out:
            raise QuestionSpaceTooSmall(
                f"the dataset has {len(held) + distinct} distinct questions, too few to hold out EVAL_SAMPLES="
                f"{held_out} and train on as many others; lower EVAL_SAMPLES to at most {(len(held) + distinct) // 2} "
                "or use more rows (DATASET_MAX_ROWS)"
            )

    @classmethod
    def from_settings(cls, config: Any) -> DatasetTask:
        """The dataset of a node's TrainingSettings (DATASET_PATH and its companions), read from its own copy."""
        if not config.dataset_path:
            raise ValueError("DATASET_PATH=<unset>: TASK_SOURCE=datasets needs this node's copy of the dataset")
        if config.dataset_answer_check == "math" and importlib.util.find_spec("math_verify") is None:
            raise ValueError(
                "DATASET_ANSWER_CHECK=math: math-verify is not installed (pip install 'swarm-gdrive[datasets]'), or "
                "use DATASET_ANSWER_CHECK=numeric or exact"
            )
        rows = load_rows(
            config.dataset_path, config.dataset_config, config.dataset_split, config.dataset_max_rows,
            config.gdrive_path, cache_dir(config.local_dir),
        )  # fmt: skip
        return cls(
            rows,
            config.seed,
            config.dataset_question_column,
            config.dataset_answer_column,
            config.dataset_answer_check,
            config.eval_samples,
            config.answer_extraction,
            config.dataset_system_prompt,
        )

    def set_level(self, task: str, level: int) -> None:
        if level != 0:
            raise ValueError(f"{task} has one level (a dataset has no curriculum), not {level}")

    def _question(self, index: int) -> Question:
        row = self.rows[index]
        entry = {
            "question": self._questions[index],
            "answer": reference_answer(str(row[self.answer_column])),
            "columns": row,
            "metadata": {"source_dataset": TASK_NAME, "index": index},
        }
        provenance = Provenance(
            dataset=TASK_NAME, config={"fingerprint": self.fingerprint}, seed=self.seed, index=index
        )
        return Question(TASK_NAME, entry["question"], entry, provenance)

    def split(self, draws: int) -> TaskSplit:
        """The held-out split as a worker reports it at start (:func:`~swarm_gdrive.training.twins.log_splits`): the
        near-twins kept out of training, and the distinct questions against the run's ``draws``."""
        train = self._train_keys
        return TaskSplit(
            task=TASK_NAME,
            held_out=len(self._held),
            near_twins=self.near_twins,
            crossing=len(train & self._held_keys),
            scanned=len(self.rows),
            distinct=len(train) + len(self._held),
            space=float(len(train) + len(self._held)),
            draws=draws,
        )

    def draw(self, n: int, rng: random.Random) -> list[Question]:
        """``n`` rows drawn uniformly from the training rows (never a held-out question's text)."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        return [self._question(self._train[rng.randrange(len(self._train))]) for _ in range(n)]

    def eval_questions(self, task: str, n: int, level: int = 0) -> list[Question]:
        """The held-out rows: the first ``n`` distinct questions of the seeded order, the same on every node."""
        if task != TASK_NAME or not 0 < n <= self.held_out:
            raise ValueError(f"{task}: {self.held_out} held-out questions (EVAL_SAMPLES) of {TASK_NAME!r}; asked {n}")
        return [self._question(i) for i in self._held[:n]]

    def is_held_out(self, question: str) -> bool:
        return normalise_question(question) in self._held_keys

    def regenerate(self, group: RolloutGroup) -> dict[str, Any] | None:
        """This node's row for a peer's group, or None: another task, dataset (fingerprint) or seed, an index out of
        range, a question text that differs from the row's, or a held-out question."""
        prov = group.provenance
        reason = ""
        if prov.dataset != TASK_NAME or group.task != TASK_NAME:
            reason = f"task {prov.dataset!r} is not this node's dataset"
        elif prov.config != {"fingerprint": self.fingerprint}:
            reason = f"dataset {prov.config} differs from this node's {self.fingerprint}"
        elif prov.seed != self.seed:
            reason = f"seed {prov.seed} differs from this node's {self.seed}"
        elif not 0 <= prov.index < len(self.rows):
            reason = f"index {prov.index} is out of range ({len(self.rows)} rows)"
        elif self._questions[prov.index] != group.question:
            reason = "question text differs from this node's row"
        elif self.is_held_out(group.question):
            reason = "a held-out evaluation question (same text)"
        if reason:
            logger.debug("dropping group %s: %s", group.group_id, reason)
            return None
        return self._question(prov.index).entry

    def correctness(self, entry: dict[str, Any], completion: str) -> float:
        """:func:`check_answer` of the completion's extracted answer (ANSWER_EXTRACTION) against the reference."""
        return check_answer(rewards.extract_answer(completion, self.extraction), entry["answer"], self.answer_check)

    def columns(self, entry: dict[str, Any]) -> dict[str, Any]:
        """The row's columns, as TRL passes a dataset's columns to reward functions."""
        return copy.deepcopy(entry["columns"])  # a reward function that changes a value never changes the rows

    def messages(self, question: str) -> list[dict[str, str]]:
        """DATASET_SYSTEM_PROMPT (unset: reasoning-gym's default), then the question."""
        return build_messages(question, self.system_prompt)
