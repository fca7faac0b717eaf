"""Each layer owns the settings it reads, and :class:`swarm_gdrive.config.Config` is all of them, composed."""

from __future__ import annotations

import dataclasses

import pytest

from swarm_gdrive.config import FINGERPRINT_FIELDS, Config, env_fields, from_env
from swarm_gdrive.envparse import ConfigError
from swarm_gdrive.protocol.settings import ProtocolSettings, check_relations
from swarm_gdrive.storage import storage_for
from swarm_gdrive.storage.settings import StorageSettings
from swarm_gdrive.training.settings import TrainingSettings

LAYERS = (StorageSettings, ProtocolSettings, TrainingSettings, Config)


def own_fields(cls: type) -> list[str]:
    """The fields ``cls`` declares itself, not those of the layer it extends."""
    below = {f.name for f in dataclasses.fields(cls.__mro__[1])} if cls is not StorageSettings else set()
    return [f.name for f in dataclasses.fields(cls) if f.name not in below]


def test_every_setting_is_owned_by_one_layer_and_composed_in_layer_order() -> None:
    owned = [name for layer in LAYERS for name in own_fields(layer)]
    assert owned == [f.name for f in env_fields()]
    assert len(owned) == len(set(owned))
    assert all(own_fields(layer) for layer in LAYERS)


def test_each_layers_settings_extend_the_one_below() -> None:
    assert [cls for cls in Config.__mro__ if cls in LAYERS] == list(reversed(LAYERS))


def test_a_layer_reads_its_settings_without_the_composition(tmp_path) -> None:
    """The protocol's settings alone: a fingerprint of the protocol's fields, its relation checks, and storage's
    settings open the folder."""
    settings = ProtocolSettings(gdrive_path=str(tmp_path), liveness_timeout=10.0, heartbeat_interval=10.0)
    assert set(settings.fingerprint_fields()) == set(ProtocolSettings.FINGERPRINT_FIELDS)
    assert set(ProtocolSettings.FINGERPRINT_FIELDS) < set(FINGERPRINT_FIELDS)
    with pytest.raises(ConfigError, match="LIVENESS_TIMEOUT=10.0: must exceed 2 x HEARTBEAT_INTERVAL"):
        check_relations(settings)
    assert storage_for(StorageSettings(gdrive_path=str(tmp_path))).describe() == f"local folder {tmp_path}"


def test_the_composition_fingerprints_every_layers_defining_fields(tmp_path) -> None:
    config = from_env({"GDRIVE_PATH": str(tmp_path), "SWARM_LOCAL_DIR": f"{tmp_path}-local", "WORKLOAD": "synthetic"})
    assert tuple(config.fingerprint_fields()) == FINGERPRINT_FIELDS
    names = {f.name for f in env_fields()}
    assert set(FINGERPRINT_FIELDS) <= names
