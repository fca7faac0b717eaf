"""A node's own folders are never inside the shared folder: SWARM_LOCAL_DIR (identities, their locks, restored
checkpoints) and TRACKING_DIR (tracker runs) are written in place, where any participant could plant a link or a
file for the node to write through (issue 30, class 1). Like MODEL_CACHE_DIR, they are refused there."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarm_gdrive.config import ConfigError, from_env


@pytest.mark.parametrize("var", ["SWARM_LOCAL_DIR", "TRACKING_DIR"])
@pytest.mark.parametrize("inside", [".", "local", "a/b", "../shared/local"])
def test_a_node_folder_inside_the_shared_folder_is_refused(tmp_path: Path, var: str, inside: str) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    with pytest.raises(ConfigError) as info:
        from_env({"GDRIVE_PATH": str(shared), var: str(shared / inside), "WORKLOAD": "synthetic"})
    assert info.value.var == var
    message = str(info.value)
    assert f"GDRIVE_PATH={str(shared.resolve())!r}" in message and "outside GDRIVE_PATH" in message


@pytest.mark.parametrize("var", ["SWARM_LOCAL_DIR", "TRACKING_DIR"])
def test_a_symlink_does_not_hide_a_node_folder_inside_the_shared_folder(tmp_path: Path, var: str) -> None:
    shared = tmp_path / "shared"
    (shared / "inner").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(shared / "inner")
    with pytest.raises(ConfigError) as info:
        from_env({"GDRIVE_PATH": str(shared), var: str(tmp_path / "alias"), "WORKLOAD": "synthetic"})
    assert info.value.var == var


@pytest.mark.parametrize("var", ["SWARM_LOCAL_DIR", "TRACKING_DIR"])
def test_a_node_folder_beside_the_shared_folder_is_accepted(tmp_path: Path, var: str) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    config = from_env({"GDRIVE_PATH": str(shared), var: str(tmp_path / "shared-local"), "WORKLOAD": "synthetic"})
    assert Path(config.local_dir if var == "SWARM_LOCAL_DIR" else config.tracking_dir) == tmp_path / "shared-local"


def test_a_url_shared_folder_holds_no_local_folder() -> None:
    config = from_env({"GDRIVE_PATH": "memory://bucket/rl-swarm", "SWARM_LOCAL_DIR": "/tmp/x", "WORKLOAD": "synthetic"})
    assert config.local_dir == "/tmp/x"
