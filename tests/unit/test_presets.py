"""The presets are data (swarm_gdrive/presets/*.json): every one loads, sets only settings that config knows and
that config accepts, ``extends`` resolves, an unknown name or a malformed file is a clear error, and the wheel
ships the files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from swarm_gdrive import presets
from swarm_gdrive.config import (
    LOCAL_SWARM_PRESET,
    SMALL_MODEL_PRESET,
    SPARSE_SIGNAL_PRESET,
    TEST_MODE_PRESET,
    env_fields,
    from_env,
)

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "swarm_gdrive" / "presets"


def test_every_file_is_a_preset_and_loads():
    assert presets.names() == tuple(sorted(p.stem for p in FOLDER.glob("*.json")))
    assert set(presets.names()) >= {"test-mode", "small-model", "sparse-signal", "local-swarm"}
    for name in presets.names():
        preset = presets.get(name)
        assert preset.name == name and preset.description.strip()
        assert preset.settings and all(isinstance(v, str) for v in preset.settings.values())
        assert set(preset.why) <= set(preset.settings)


def test_config_exports_the_presets_read_from_the_data():
    assert presets.load("test-mode") == TEST_MODE_PRESET
    assert presets.load("small-model") == SMALL_MODEL_PRESET
    assert presets.load("sparse-signal") == SPARSE_SIGNAL_PRESET
    assert presets.load("local-swarm") == LOCAL_SWARM_PRESET


def test_task_config_is_the_json_text_the_nodes_and_earlier_runs_had():
    """A JSON object in a preset file becomes its JSON text, byte for byte the string config.py held before the
    presets became data: bench/learning.py's settings digest of a finished run stays the same."""
    assert SMALL_MODEL_PRESET["TASK_CONFIG"] == (
        '{"chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}, '
        '"basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}'
    )
    assert SPARSE_SIGNAL_PRESET["TASK_CONFIG"] == (
        '{"chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2}, '
        '"basic_arithmetic": {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1}}'
    )


def test_sparse_signal_extends_small_model_with_its_overrides_in_place():
    own = json.loads((FOLDER / "sparse-signal.json").read_text())
    assert own["extends"] == "small-model" and set(own["settings"]) == {"TASK_CONFIG", "EVAL_SAMPLES"}
    small, sparse = presets.load("small-model"), presets.load("sparse-signal")
    assert list(sparse) == list(small)  # the base's order, the overrides where the base has them
    assert {k: v for k, v in sparse.items() if small[k] != v} == {
        "TASK_CONFIG": sparse["TASK_CONFIG"],
        "EVAL_SAMPLES": "100",
    }
    assert presets.get("sparse-signal").why["MICRO_BATCH_SIZE"] == presets.get("small-model").why["MICRO_BATCH_SIZE"]
    assert presets.get("sparse-signal").why["EVAL_SAMPLES"] != presets.get("small-model").why["EVAL_SAMPLES"]


def test_every_variable_a_preset_sets_is_a_setting_of_config():
    known = {f.metadata["env"] for f in env_fields()}
    for name in presets.names():
        unknown = sorted(set(presets.load(name)) - known)
        assert not unknown, f"{name}: {unknown} are not settings of config.py"


@pytest.mark.parametrize("name", presets.names())
def test_config_accepts_every_preset(tmp_path, name):
    """Each preset's values parse and pass config's checks (a worker's task mix included)."""
    (tmp_path / "shared").mkdir()
    env = {
        **presets.load(name),
        "GDRIVE_PATH": str(tmp_path / "shared"),
        "SWARM_LOCAL_DIR": str(tmp_path / "local"),
        "NODE_ROLE": "worker",
    }
    config = from_env(env)
    fields = {f.metadata["env"]: f for f in env_fields()}
    for var, value in presets.load(name).items():
        assert getattr(config, fields[var].name) == fields[var].metadata["parse"](var, value), var


def test_aliases_and_a_new_dict_each_load():
    assert presets.load("demo") == presets.load("small-model") and presets.get("sparse").name == "sparse-signal"
    assert "demo" not in presets.names() and "sparse" not in presets.names()
    first = presets.load("test-mode")
    first["MAX_ROUNDS"] = "99"
    assert presets.load("test-mode")["MAX_ROUNDS"] == "3" and TEST_MODE_PRESET["MAX_ROUNDS"] == "3"


def test_an_unknown_preset_names_the_known_ones():
    with pytest.raises(presets.PresetError) as err:
        presets.load("sparse-signals")
    message = str(err.value)
    assert "unknown preset 'sparse-signals'" in message and "swarm_gdrive/presets/*.json" in message
    for name in presets.names():
        assert name in message
    assert "small-model (or demo)" in message


def _write(folder: Path, name: str, data: object) -> None:
    (folder / f"{name}.json").write_text(data if isinstance(data, str) else json.dumps(data))


GOOD = {"description": "a base", "settings": {"MAX_ROUNDS": "3"}}


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"a": "{not json"}, "a.json: not valid JSON"),
        ({"a": ["MAX_ROUNDS"]}, "a.json: write a JSON object"),
        ({"a": {**GOOD, "comment": "x"}}, "a.json: unknown field(s) comment"),
        ({"a": {"settings": {"MAX_ROUNDS": "3"}}}, "a.json: 'description' is required"),
        ({"a": {"description": "d", "settings": {}}}, "a.json: 'settings' is required"),
        ({"a": {"description": "d", "settings": {"max_rounds": "3"}}}, "'max_rounds' is not an environment variable"),
        ({"a": {"description": "d", "settings": {"MAX_ROUNDS": 3}}}, "MAX_ROUNDS = 3: write the value as a string"),
        ({"a": {**GOOD, "why": {"SEED": "x"}}}, "a.json: 'why' explains SEED, which 'settings' does not set"),
        ({"a": {**GOOD, "extends": "b"}}, "a.json: extends 'b', which is not a preset"),
        ({"a": {**GOOD, "extends": "b"}, "b": {**GOOD, "extends": "a"}}, "goes round in a circle: a -> b -> a"),
        ({"a": {**GOOD, "extends": "a"}}, "goes round in a circle: a -> a"),
        ({"a": {**GOOD, "aliases": ["b"]}, "b": GOOD}, "a.json: alias 'b' already names the preset 'b'"),
        ({"a": {**GOOD, "aliases": ["x"]}, "b": {**GOOD, "aliases": ["x"]}}, "alias 'x' already names the preset 'a'"),
        ({"A_B": GOOD}, "A_B.json: a preset's name is lower-case letters"),
    ],
)
def test_a_malformed_preset_file_is_refused_with_its_name(tmp_path, files, expected):
    for name, data in files.items():
        _write(tmp_path, name, data)
    with pytest.raises(presets.PresetError) as err:
        presets.read_folder(tmp_path, "here")
    assert str(err.value).startswith("here/") and expected in str(err.value)


def test_a_folder_of_presets_resolves_extends_in_any_order(tmp_path):
    _write(tmp_path, "a-child", {"description": "c", "extends": "z-base", "settings": {"SEED": "7"}})
    _write(tmp_path, "z-base", {"description": "b", "settings": {"SEED": "1", "TASK_CONFIG": {"x": {"y": 1}}}})
    found = presets.read_folder(tmp_path, "here")
    assert dict(found["a-child"].settings) == {"SEED": "7", "TASK_CONFIG": '{"x": {"y": 1}}'}
    assert found["a-child"].extends == "z-base" and found["z-base"].extends is None


def test_the_wheel_ships_every_preset(tmp_path):
    """The notebooks install the wheel: without setup.py's package_data the JSON files would be left out of it."""
    pytest.importorskip("setuptools")
    pytest.importorskip("wheel")
    source = tmp_path / "source"
    source.mkdir()
    for name in ("setup.py", "README.md", "requirements.txt", "pyproject.toml"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "swarm_gdrive", source / "swarm_gdrive", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp_path, source],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("swarm_gdrive-*.whl")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("swarm_gdrive/presets/")}
    assert shipped >= {f"swarm_gdrive/presets/{p.name}" for p in FOLDER.glob("*.json")}
