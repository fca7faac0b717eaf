"""pydantic-settings reads the environment (:func:`swarm_gdrive.envparse.read_env`): from the mapping it is given,
by the exact variable names, each field's parser its validator, the first error in the fields' order."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from swarm_gdrive.config import Config, from_env
from swarm_gdrive.envparse import ConfigError, read_env, settings_model
from swarm_gdrive.storage.settings import GDRIVE_PATH_FIX, StorageSettings


def test_each_settings_class_has_one_model_built_from_its_fields() -> None:
    model = settings_model(Config)
    assert settings_model(Config) is model  # built once
    assert issubclass(model, BaseSettings)
    aliases = {name: info.validation_alias for name, info in model.model_fields.items()}
    assert aliases == {f.name: f.metadata["env"] for f in dataclasses.fields(Config)}
    storage = settings_model(StorageSettings)
    assert storage is not model and set(storage.model_fields) == {f.name for f in dataclasses.fields(StorageSettings)}
    assert model.model_fields["gdrive_path"].is_required() and not model.model_fields["seed"].is_required()


def test_the_given_mapping_is_read_not_os_environ(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SEED", "7")
    monkeypatch.setenv("MAX_ROUNDS", "9")
    values = read_env(Config, {"GDRIVE_PATH": str(tmp_path), "SEED": " 3 "})
    assert values == {"gdrive_path": str(tmp_path.resolve()), "seed": 3}  # parsed; MAX_ROUNDS left to its default
    config = from_env({"GDRIVE_PATH": str(tmp_path), "SWARM_LOCAL_DIR": f"{tmp_path}-local", "SEED": "3"})
    assert (config.seed, config.max_rounds) == (3, 2000)


def test_unknown_variables_are_ignored_and_names_are_exact(tmp_path) -> None:
    env = {"GDRIVE_PATH": str(tmp_path), "NOT_A_SETTING": "x", "seed": "5", "Max_Rounds": "0", "_env_file": ".env"}
    assert read_env(Config, env) == {"gdrive_path": str(tmp_path.resolve())}


def test_the_first_error_in_field_order_is_raised_as_the_parsers_own(tmp_path) -> None:
    # MAX_ROUNDS comes first in the mapping, SEED first among the fields: SEED's error is the one raised
    env = {"GDRIVE_PATH": str(tmp_path), "MAX_ROUNDS": "0", "SEED": "x", "HUGGINGFACE_ACCESS_TOKEN": "hf_secret_1"}
    with pytest.raises(ConfigError) as caught:
        read_env(Config, env)
    error = caught.value
    assert (error.var, error.value, error.fix) == ("SEED", "x", "use a whole number >= 0")
    assert str(error) == "SEED='x': use a whole number >= 0"
    chained = [error.__cause__, error.__context__]  # no ValidationError chained to it: its text quotes the values
    assert not any(isinstance(e, ValidationError) for e in chained)
    assert "hf_secret_1" not in str(error)
    with pytest.raises(ConfigError, match=r"^MAX_ROUNDS='0': use a whole number >= 1$"):
        read_env(Config, {**env, "SEED": "1"})


def test_an_unset_required_variable_is_named_before_any_other_error() -> None:
    with pytest.raises(ConfigError) as caught:
        read_env(Config, {"SEED": "x"})
    assert (caught.value.var, caught.value.value, caught.value.fix) == ("GDRIVE_PATH", None, GDRIVE_PATH_FIX)
    assert str(caught.value) == f"GDRIVE_PATH=<unset>: {GDRIVE_PATH_FIX}"


def test_a_layer_reads_its_own_settings_alone(tmp_path) -> None:
    env = {"GDRIVE_PATH": str(tmp_path), "PYDRIVE2_SETTINGS": "~/s.yaml", "SEED": "not read by storage"}
    settings = StorageSettings(**read_env(StorageSettings, env))
    assert settings.gdrive_path == str(tmp_path.resolve())
    assert not settings.pydrive2_settings.startswith("~")
    assert settings.gdrive_token_file is None
