"""Texts derived from the code fail here when they drift from it (issue #29): docs/code-map.md and the generated caps
of GDRIVE_IMPLEMENTATION.md are what ``docs/generate.py`` writes; the document's record tables list each pydantic
model's fields, its event table the events the package writes, both ways; the document stays under 80,000 bytes;
the figures' texts come from one table. docs/settings.md is checked in test_config.py
(``test_docs_settings_is_generated_from_config``)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_PROTOCOL_BYTES = 80_000


def _load_generator():
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


generate = _load_generator()


@pytest.fixture(scope="module")
def protocol_doc() -> str:
    return (ROOT / "GDRIVE_IMPLEMENTATION.md").read_text(encoding="utf-8")


def _field_drift(doc: str) -> list[str]:
    """Each model whose documented fields differ from its code, with the difference; [] when none does."""
    documented = generate.documented_fields(doc)
    problems = []
    for name, model in generate.record_models().items():
        if name not in documented:
            problems.append(f"{name}: no table after a line '<!-- fields: {name} -->'")
            continue
        fields = set(model.model_fields) - {"kind", "schema_version"}
        if missing := fields - documented[name]:
            problems.append(f"{name}: fields in the code, not in its table: {sorted(missing)}")
        if extra := documented[name] - fields:
            problems.append(f"{name}: fields in its table, not in the code: {sorted(extra)}")
    problems += [
        f"{name}: a table for a model records.py does not have"
        for name in set(documented) - set(generate.record_models())
    ]
    return problems


def _event_drift(doc: str) -> list[str]:
    documented = generate.documented_events(doc)
    emitted = generate.emitted_events()
    problems = [f"written by the code, not in §12.2: {sorted(set(emitted) - set(documented))}"] * bool(
        set(emitted) - set(documented)
    )
    problems += [f"in §12.2, written by no code: {sorted(set(documented) - set(emitted))}"] * bool(
        set(documented) - set(emitted)
    )
    for name in set(emitted) & set(documented):
        if unlisted := {level for level in emitted[name] if level not in documented[name]}:
            problems.append(f"{name}: written at level(s) {sorted(unlisted)}, §12.2 says '{documented[name]}'")
    return problems


def test_the_code_map_is_generated_from_the_code():
    page = (ROOT / "docs" / "code-map.md").read_text(encoding="utf-8")
    assert page == generate.code_map(), f"docs/code-map.md differs from the code; run: {generate.WRITE_HINT}"


def test_the_code_map_lists_every_module_and_names_only_files_that_exist():
    page = generate.code_map()
    for path in (ROOT / "swarm_gdrive").rglob("*.py"):
        assert f"`swarm_gdrive/{path.relative_to(ROOT / 'swarm_gdrive').as_posix()}`" in page
    assert "`swarm_gdrive/training/adapters.py`" in page  # the module the hand-kept map had missed
    guides = generate.CODE_MAP_GUIDES + generate.CODE_MAP_TAIL
    named = set(re.findall(r"`((?:swarm_gdrive|tests|docs|notebooks|bench)/[\w/.]+\.(?:py|md))`", guides))
    assert named, "the guides name the files to touch"
    assert [n for n in sorted(named) if not (ROOT / n).exists()] == [], "the guides name files that do not exist"


def test_the_generated_caps_of_the_protocol_document_are_the_codes(protocol_doc):
    assert protocol_doc == generate.fill(protocol_doc, generate.blocks()), (
        f"GDRIVE_IMPLEMENTATION.md's generated parts differ from the code; run: {generate.WRITE_HINT}"
    )
    from swarm_gdrive.protocol.records import MAX_BYTES

    caps = generate.caps()
    assert all(f"| {generate._size(cap)} |" in caps for cap in MAX_BYTES.values())
    assert "| `RolloutGroup.token_ids` | ≤ 64 items, each ≤ 4 096 items |" in caps


def test_the_protocol_document_stays_short(protocol_doc):
    size = len(protocol_doc.encode("utf-8"))
    assert size <= MAX_PROTOCOL_BYTES, (
        f"GDRIVE_IMPLEMENTATION.md is {size} bytes, over {MAX_PROTOCOL_BYTES}: it specifies the protocol; "
        "the code's details belong in its docstrings, measurements in bench/README.md"
    )


def test_every_record_table_lists_exactly_its_models_fields(protocol_doc):
    assert _field_drift(protocol_doc) == []


def test_a_field_left_out_of_a_table_or_made_up_is_caught(protocol_doc):
    row = "| `mode` | `sync` \\| `async`, default `sync` | `ROUND_MODE` of the run"
    dropped = protocol_doc.replace(row, "| x | | ", 1)
    assert dropped != protocol_doc
    assert _field_drift(dropped) == ["ExperimentRecord: fields in the code, not in its table: ['mode']"]
    invented = protocol_doc.replace("| `heartbeat_at` |", "| `heartbeat_at`, `pulse` |", 1)
    assert _field_drift(invented) == ["PeerRecord: fields in its table, not in the code: ['pulse']"]


def test_the_event_table_lists_exactly_the_events_the_code_writes(protocol_doc):
    assert _event_drift(protocol_doc) == []


def test_an_event_missing_from_the_table_or_at_another_level_is_caught(protocol_doc):
    row = next(line for line in protocol_doc.splitlines() if line.startswith("| `worker_completed` |"))
    assert _event_drift(protocol_doc.replace(row + "\n", "")) == [
        "written by the code, not in §12.2: ['worker_completed']"
    ]
    relevelled = protocol_doc.replace(row, row.replace("| info |", "| warning |"))
    assert _event_drift(relevelled) == ["worker_completed: written at level(s) ['info'], §12.2 says 'warning'"]


def test_every_figure_has_its_texts_in_the_one_table():
    from swarm_gdrive.observe import plots, web
    from swarm_gdrive.observe.figure_texts import FIGURE_TEXTS, figure_texts

    drawn = {**plots.FIGURES, **plots.ASYNC_FIGURES}
    assert set(FIGURE_TEXTS) == set(drawn) | {"experiments_overlay"}
    assert set(figure_texts("report")) >= set(drawn), "report heads every figure it draws"
    shown = {**web.FIGURES, **web.ASYNC_FIGURES, **web.ASYNC_CAPTIONS}
    assert set(shown) <= set(drawn)
    for name, caption in shown.items():
        text = FIGURE_TEXTS[name]
        assert caption in (text.page, text.async_page)
