"""The texts derived from the code, written from it, so that they cannot drift from it unseen.

- ``docs/code-map.md``, whole: every package and module of ``swarm_gdrive`` with the first sentence of its docstring,
  the floors of the import-linter contract (``pyproject.toml``), and the hand-written guides kept below in this
  file (where to add a storage backend, a task, a plot).
- The generated parts of ``GDRIVE_IMPLEMENTATION.md``, between ``<!-- generated:NAME -->`` and
  ``<!-- /generated:NAME -->``: the size caps of every file a node reads and the length limits of every record
  (``caps``).

The rest of GDRIVE_IMPLEMENTATION.md is prose; ``tests/unit/test_derived_texts.py`` checks its record tables
(against the pydantic models) and its event table (against the events the code emits) both ways, with the helpers
:func:`documented_fields`, :func:`documented_events` and :func:`emitted_events` here.

    python docs/generate.py            # exit 1 and say which text differs
    python docs/generate.py --write    # rewrite them

Only the standard library and the package's own ``protocol.records`` (pydantic) are imported: the other constants
are read from the source, so no model library is loaded.
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import re
import sys
import types
import typing
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "swarm_gdrive"
CODE_MAP = ROOT / "docs" / "code-map.md"
PROTOCOL_DOC = ROOT / "GDRIVE_IMPLEMENTATION.md"
WRITE_HINT = "python docs/generate.py --write"

# -- reading the code --------------------------------------------------------------------------------------------


#: What a module without a docstring is.
NO_DOCSTRING = {"__main__.py": "`python -m swarm_gdrive` is the `swarm-gdrive` command."}


def summary(path: Path) -> str:
    """The first sentence of a module's docstring (its first paragraph, cut at the first full stop)."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    # Sphinx roles (:func:`~a.b.c`) and reST literals (``x``) as Markdown code.
    paragraph = re.sub(r":\w+:`~?\.?([^`]*)`", lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", paragraph)
    paragraph = paragraph.replace("``", "`")
    match = re.search(r"(?<![ .][a-z]\.[a-z])\.(?=\s+[A-Z`(:]|$)", paragraph)
    return paragraph[: match.start() + 1] if match else paragraph


def data_summary(path: Path) -> str:
    """A data file's own description (a preset's ``description``, first sentence), else "data"."""
    if path.suffix == ".json":
        try:
            description = json.loads(path.read_text(encoding="utf-8")).get("description", "")
        except (ValueError, AttributeError):
            description = ""
        if isinstance(description, str) and description:
            text = " ".join(description.split())
            match = re.search(r"\.(?=\s+[A-Z`(]|$)", text)
            return "Data: " + (text[: match.start() + 1] if match else text)
    return "data"


def modules() -> dict[str, list[tuple[str, str]]]:
    """Each folder of the package (``""`` for the top) to its modules and data files: (path, summary)."""
    found: dict[str, list[tuple[str, str]]] = {}
    for path in sorted(PACKAGE.rglob("*")):
        relative = path.relative_to(PACKAGE)
        if "__pycache__" in relative.parts or path.is_dir() or path.name.startswith("."):
            continue
        folder = "/".join(relative.parts[:-1])
        if path.suffix == ".py":
            text = summary(path) or NO_DOCSTRING.get(relative.as_posix(), "(no docstring)")
        else:
            text = data_summary(path)
        found.setdefault(folder, []).append((relative.as_posix(), text))
    return found


def layers() -> list[str]:
    """The floors of the first import-linter ``layers`` contract in pyproject.toml, top first."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract["type"] == "layers":
            return [layer.replace("swarm_gdrive.", "") for layer in contract["layers"]]
    raise SystemExit("pyproject.toml: no import-linter contract of type 'layers' to draw the floors from")


def _value(node: ast.expr, values: dict[str, object]) -> object:
    """The value of a constant expression: literals, names already known, tuples, + - * **."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in values:
        return values[node.id]
    if isinstance(node, ast.Tuple):
        return tuple(_value(item, values) for item in node.elts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Pow):
        left, right = _value(node.left, values), _value(node.right, values)
        operations = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Pow: operator.pow}
        return operations[type(node.op)](left, right)
    raise ValueError(ast.unparse(node))


def constants(path: Path) -> dict[str, object]:
    """The module-level constants of a source file that are arithmetic on literals (``64 * 1024``), without
    importing it."""
    values: dict[str, object] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if not isinstance(node, ast.Assign):
            continue
        try:
            got = _value(node.value, values)
        except (ValueError, TypeError):
            continue
        for target in node.targets:
            if isinstance(target, ast.Name):
                values[target.id] = got
            elif isinstance(target, ast.Tuple) and isinstance(got, tuple) and len(got) == len(target.elts):
                values.update({t.id: v for t, v in zip(target.elts, got, strict=True) if isinstance(t, ast.Name)})
    return values


def emitted_events() -> dict[str, set[str]]:
    """Every event name the package writes (a call ``….event("name", …)`` or ``event("name", …)``, the name a
    string, a conditional of strings or a dict of strings indexed), with the levels it is written at."""
    events: dict[str, set[str]] = {}

    def names(node: ast.expr) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.IfExp):
            return names(node.body) + names(node.orelse)
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Dict):
            return [name for item in node.value.values for name in names(item)]
        raise ValueError(f"an event name that is no string: {ast.unparse(node)}")

    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called != "event" or not node.args:
                continue
            try:
                found = names(node.args[0])
            except ValueError as error:
                raise SystemExit(f"{path.relative_to(ROOT)}:{node.lineno}: {error}") from None
            level = next((k.value for k in node.keywords if k.arg == "level"), None)
            levels = names(level) if level is not None else ["info"]
            for name in found:
                events.setdefault(name, set()).update(levels)
    return events


# -- reading the protocol document -------------------------------------------------------------------------------


def _section(doc: str, heading: str) -> str:
    """The text of the section whose heading line starts with ``heading`` (up to the next heading of its level)."""
    match = re.search(rf"^(#+) {re.escape(heading)}.*$", doc, re.MULTILINE)
    if not match:
        raise ValueError(f"GDRIVE_IMPLEMENTATION.md has no heading '{heading}'")
    level = len(match.group(1))
    end = re.search(rf"^#{{1,{level}}} ", doc[match.end() :], re.MULTILINE)
    return doc[match.end() : match.end() + end.start()] if end else doc[match.end() :]


def _first_column(table: str) -> list[str]:
    """The backticked names of each row's first cell of a markdown table (the header and rule left out)."""
    rows = [line for line in table.splitlines() if line.startswith("|")][2:]
    return [name for row in rows for name in re.findall(r"`([a-z_0-9]+)`", row.split("|")[1])]


def documented_fields(doc: str) -> dict[str, set[str]]:
    """Each record model's fields as the document's tables list them: the table after a line
    ``<!-- fields: Model -->``, its first column."""
    found = {}
    for match in re.finditer(r"^<!-- fields: (\w+) -->\n((?:\|.*\n)+)", doc, re.MULTILINE):
        found[match.group(1)] = set(_first_column(match.group(2)))
    return found


def documented_events(doc: str) -> dict[str, str]:
    """The event table of §12.2: each event name to its Level cell."""
    rows = [line for line in _section(doc, "12.2 Events").splitlines() if line.startswith("| `")]
    return {
        name: row.split("|")[3].strip() for row in rows for name in re.findall(r"`([a-z_0-9]+)`", row.split("|")[1])
    }


# -- the generated texts -----------------------------------------------------------------------------------------


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n:,} bytes".replace(",", " ")


def _count(n: int) -> str:
    return f"{n:,}".replace(",", " ")


#: Where each kind of record lives (records.MAX_BYTES' keys); a kind missing here stops the generator.
KIND_FILES = {
    "experiment": "`experiment.json`",
    "state": "`state/current_state.json`",
    "peer": "`peers/{node}.json`",
    "reward": "`rewards/round_R/stage_S/{node}.json`",
    "rollouts": "`rollouts/round_R/stage_S/{node}.json`",
    "metric": "a line of `logs/{node}/metrics.jsonl`",
    "event": "a line of `logs/{node}/training_events.jsonl`",
    "eval": "`evals/round_R/{node}.json`",
}

#: The other caps on what a node reads: (source file, constant, what it caps).
OTHER_CAPS = [
    ("storage/base.py", "DEFAULT_MAX_READ_BYTES", "any read that names no cap of its own"),
    ("protocol/gather.py", "MAX_GATHER_FILES", "rollout files one stage's gather or pickup reads"),
    ("protocol/gather.py", "MAX_GATHER_BYTES", "bytes one stage's gather or pickup reads"),
    ("training/checkpoint.py", "MAX_MANIFEST_BYTES", "a checkpoint's `checkpoint.json`"),
    ("training/checkpoint.py", "MAX_MANIFEST_FILES", "files a checkpoint manifest lists"),
    ("training/checkpoint.py", "MAX_FILE_BYTES", "one file a manifest lists (its `size`)"),
    ("training/adapters.py", "MAX_ADAPTER_CONFIG_BYTES", "a checkpoint's `adapter_config.json`"),
    ("storage/drive.py", "INLINE_MAX_BYTES", "a file carried in its Drive listing entry (§15.2)"),
]


def _limits(annotation: object, metadata: list, what: str = "") -> list[str]:
    """The length limits of one field, its items' too (``Annotated`` constraints, pydantic's ``Field``)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        inner, *extra = typing.get_args(annotation)
        extra = [m for item in extra for m in getattr(item, "metadata", None) or [item]]  # a Field(): its constraints
        return _limits(inner, [*metadata, *extra], what)
    if origin in (typing.Union, types.UnionType):  # X | None: the limits of X
        return [
            limit
            for option in typing.get_args(annotation)
            if option is not type(None)
            for limit in _limits(option, metadata, what)
        ]
    low = next((m.min_length for m in metadata if getattr(m, "min_length", None)), None)
    high = next((m.max_length for m in metadata if getattr(m, "max_length", None)), None)
    unit = "chars" if annotation is str else "entries" if origin is dict else "items"
    found = []
    if high is not None and not (annotation is str and high == 128):  # ShortText: in the types table
        found.append(f"{what}{low}..{_count(high)} {unit}" if low else f"{what}≤ {_count(high)} {unit}")
    if origin in (list, dict):
        found += _limits(typing.get_args(annotation)[-1], [], "each ")
    return found


def record_models() -> dict[str, type]:
    """Every pydantic model of ``protocol/records.py`` by name: the records and the models inside them."""
    sys.path.insert(0, str(ROOT))
    from swarm_gdrive.protocol import records

    return {
        name: model
        for name, model in vars(records).items()
        if isinstance(model, type)
        and issubclass(model, records.BaseModel)
        and model.__module__ == records.__name__
        and not name.startswith("_")
    }


def caps() -> str:
    """§3.1's tables: the size cap of each record kind, the other caps on reads, and every record's length limits."""
    sys.path.insert(0, str(ROOT))
    from swarm_gdrive.protocol import records

    missing = set(records.MAX_BYTES) - set(KIND_FILES)
    if missing:
        raise SystemExit(f"docs/generate.py: KIND_FILES has no file for the record kind(s) {sorted(missing)}")
    models = record_models()
    by_kind = {m.model_fields["kind"].default: n for n, m in models.items() if "kind" in m.model_fields}
    lines = ["| File | Record | Cap (`records.MAX_BYTES`) |", "|---|---|---|"]
    lines += [f"| {KIND_FILES[k]} | `{by_kind[k]}` | {_size(cap)} |" for k, cap in records.MAX_BYTES.items()]
    lines += ["", "| Constant | Value | Caps |", "|---|---|---|"]
    for source, name, what in OTHER_CAPS:
        value = constants(PACKAGE / source).get(name)
        if not isinstance(value, int):
            raise SystemExit(f"docs/generate.py: swarm_gdrive/{source} has no constant {name} (OTHER_CAPS)")
        shown = _count(value) if "FILES" in name else _size(value)
        lines.append(f"| `{source.removesuffix('.py').replace('/', '.')}.{name}` | {shown} | {what} |")
    lines += ["", "| Field | Limit |", "|---|---|"]
    for name, model in models.items():
        for field, info in model.model_fields.items():
            limits = _limits(info.annotation, list(info.metadata))
            if limits:
                lines.append(f"| `{name}.{field}` | {', '.join(limits)} |")
    return "\n".join(lines) + "\n"


def blocks() -> dict[str, str]:
    """The generated parts of GDRIVE_IMPLEMENTATION.md by name."""
    return {"caps": caps()}


def fill(doc: str, parts: dict[str, str]) -> str:
    """``doc`` with each ``<!-- generated:NAME -->`` … ``<!-- /generated:NAME -->`` block holding ``parts[NAME]``."""
    for name, text in parts.items():
        pattern = re.compile(rf"(<!-- generated:{name} -->\n).*?(<!-- /generated:{name} -->)", re.DOTALL)
        if not pattern.search(doc):
            markers = f"<!-- generated:{name} --> … <!-- /generated:{name} -->"
            raise SystemExit(f"GDRIVE_IMPLEMENTATION.md lacks the markers {markers}")
        doc = pattern.sub(lambda m, text=text: m.group(1) + text + m.group(2), doc)
    return doc


# -- docs/code-map.md --------------------------------------------------------------------------------------------

CODE_MAP_HEAD = """\
# Code map

<!-- Generated by `python docs/generate.py --write` from the package's docstrings and pyproject.toml; edit those
(or the guides in docs/generate.py), not this page. tests/unit/test_derived_texts.py fails while it differs. -->

`swarm_gdrive` is four layers under a few entry points. Each module owns one concept; the docstrings hold the
details and the formulas, this page only says where things are. The protocol itself is specified in
[GDRIVE_IMPLEMENTATION.md](../GDRIVE_IMPLEMENTATION.md), training in [training.md](training.md), every setting in
[settings.md](settings.md).

## Floors

The import-linter contracts in `pyproject.toml` (run by `tests/unit/test_layering.py`): a floor imports only the
floors below it; `storage` imports nothing of the package; the protocol imports neither training nor observation;
only the entry points import `observe`; no import circles. Top first:

"""

CODE_MAP_GUIDES = """\
## Where to add …

**A storage backend** (a new `GDRIVE_PATH` scheme):

1. `swarm_gdrive/storage/<name>.py`: a class that implements `storage.base.Storage` (read with a cap, atomic
   write, append, list, delete, `remove_empty_dir`, move, describe; optional `free_space`), names temporaries with
   `base.temp_name_for`, and retries only transient errors through `base.retrying`. It imports nothing of the
   package above `storage/`.
2. `swarm_gdrive/storage/__init__.py`: `open_storage` maps the URL scheme to the class.
3. `tests/contract/conftest.py`: a fixture for it, so that `tests/contract/test_storage_contract.py` and
   `tests/contract/test_readers_on_every_backend.py` run the one contract on it.
4. `docs/storage.md` (setting it up) and GDRIVE_IMPLEMENTATION.md §15 (what it adds to the protocol).

**A reasoning-gym task** (or a rule for one):

1. `swarm_gdrive/training/tasks.py`: nothing, for a task reasoning-gym ships (`TASKS=name:weight`); its
   difficulty presets (`TASK_DIFFICULTY`), `PAPER_TASKS` or `HASH_SEED_DEPENDENT_TASKS` when it belongs there.
2. `swarm_gdrive/training/rewards.py`: its verifier's safety rule, if it evaluates answer text
   (`LITERAL_ONLY_TASKS`, `UNSAFE_VERIFIER_TASKS`, `ANSWER_CHAR_LIMITS`).
3. `tests/unit/test_tasks.py` and `tests/unit/test_rewards.py`: its questions regenerate from their provenance and
   its answers score as the verifier says; GDRIVE_IMPLEMENTATION.md §5.7 names the rule.

**A dataset, a reward term or a task source** ([docs/tasks.md](tasks.md)):

1. A dataset: nothing in the package (`TASK_SOURCE=datasets`, `DATASET_PATH`, its columns and answer check); a
   reward term: a function in TRL's signature in your own module, named in `REWARD_FUNCTIONS`.
2. Another source of questions: a class that implements `swarm_gdrive/training/task.py`'s `TaskProvider` (seeded
   draws, its held-out split, `regenerate` of a peer's group from its provenance alone, a deterministic
   `correctness`), chosen in `build_task` by a new `TASK_SOURCE` value, its settings in `training/settings.py` and
   their fingerprint in `training/task_check.py`.
3. `tests/unit/test_dataset_task.py` shows the tests it needs; GDRIVE_IMPLEMENTATION.md §5.7 and §8 name its rules.

**A plot**:

1. `swarm_gdrive/observe/plots.py`: a function `Snapshot → Figure` that draws a "no data yet" figure instead of
   raising, registered in `FIGURES` (or `ASYNC_FIGURES`, asynchronous experiments only).
2. `swarm_gdrive/observe/figure_texts.py`: its title, its heading in `report` and, to show it on the web
   dashboard, its caption (`page`); `report.py`, `web.py` and the notebook dashboard then show it with no change.
3. `swarm_gdrive/observe/web.py`: its name in `FIGURES`' order, if it belongs on the page.
4. `tests/unit/test_plots_and_dashboard.py`: what it draws on a real snapshot.

"""

CODE_MAP_TAIL = """\
## Tests, notebooks, benchmarks

- `tests/unit` (pure and fast), `tests/integration` (real processes, tiny and packaged models, notebooks executed
  headless), `tests/contract` (one storage contract on every backend), `tests/faults` (kills, storage faults,
  hostile files, forged states, `NODE_ID` twins, clock skew, randomised mixes), `tests/lagged` (a folder that
  syncs late), `tests/drive_emulator.py` (Drive v3 over HTTP for the unmodified Google client),
  `tests/colab_standin` (a stand-in `google.colab`).
- `notebooks/`: generated by `notebooks/build_notebooks.py`; they call `swarm_gdrive.notebook`.
- `bench/`: `python -m bench <part>`; results in `bench/results/`, read in `bench/README.md`.
- `docs/generate.py`: this page, and the generated parts of GDRIVE_IMPLEMENTATION.md.

## Where to start reading

1. [GDRIVE_IMPLEMENTATION.md §2](../GDRIVE_IMPLEMENTATION.md#2-folder-layout-and-writers) and
   [§5](../GDRIVE_IMPLEMENTATION.md#5-the-round-protocol): the folder and the round.
2. `protocol/coordinator.py`, `decide()`: the whole round clock in one pure function;
   `tests/unit/test_coordinator.py` exercises it.
3. `protocol/worker.py`: one round of a worker, from the state to the reward.
4. `storage/base.py`: what every backend promises.
5. `protocol/sapo.py`, then `training/grpo.py` and `training/policy.py`: the learning side.
6. `launcher.py`: how a node is wired together.
"""

#: Each folder's heading on the page.
FOLDER_TITLES = {
    "": "Entry points, settings and names",
    "storage": "`storage/`: one narrow interface, several backends",
    "protocol": "`protocol/`: the shared-folder protocol",
    "training": "`training/`: GRPO on a task (reasoning-gym or a dataset)",
    "observe": "`observe/`: reading an experiment",
}


def code_map() -> str:
    """docs/code-map.md."""
    parts = [CODE_MAP_HEAD, "```text\n", *(f"{layer}\n" for layer in layers()), "```\n\n", CODE_MAP_GUIDES]
    found = modules()
    order = list(FOLDER_TITLES)
    for folder in sorted(found, key=lambda f: (order.index(f) if f in order else len(order), f)):
        title = FOLDER_TITLES.get(folder, f"`{folder}/`")
        parts.append(f"## {title}\n\n| module | what it is |\n|---|---|\n")
        parts += [f"| `swarm_gdrive/{path}` | {text.replace('|', '/')} |\n" for path, text in found[folder]]
        parts.append("\n")
    parts.append(CODE_MAP_TAIL)
    return "".join(parts)


# -- the command -------------------------------------------------------------------------------------------------


def expected() -> dict[Path, str]:
    """Each derived file as the code says it should read."""
    return {CODE_MAP: code_map(), PROTOCOL_DOC: fill(PROTOCOL_DOC.read_text(encoding="utf-8"), blocks())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the derived texts instead of checking them")
    args = parser.parse_args(argv)
    stale = []
    for path, text in expected().items():
        if path.read_text(encoding="utf-8") != text:
            stale.append(path.relative_to(ROOT).as_posix())
            if args.write:
                path.write_text(text, encoding="utf-8")
    if stale and not args.write:
        print(f"differs from the code: {', '.join(stale)}; run: {WRITE_HINT}", file=sys.stderr)
        return 1
    print(f"rewrote {', '.join(stale)}" if stale else "every derived text is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
