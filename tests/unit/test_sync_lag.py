"""SYNC_LAG: the timeouts derived from it, and explicit timeouts too short for it refused with both names."""

from __future__ import annotations

import io
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from swarm_gdrive.config import ConfigError, from_env


@pytest.fixture
def base(tmp_path: Path) -> dict[str, str]:
    shared = tmp_path / "shared"
    shared.mkdir()
    return {"GDRIVE_PATH": str(shared), "SWARM_LOCAL_DIR": str(tmp_path / "local")}


def timeouts(env: dict[str, str]) -> tuple[float, float, float]:
    c = from_env(env)
    return c.coordinator_round_interval, c.rollout_wait_timeout, c.liveness_timeout


def test_without_lag_the_timeouts_are_the_plain_defaults(base):
    assert timeouts(base) == (60.0, 30.0, 120.0)
    assert timeouts({**base, "SYNC_LAG": "0"}) == (60.0, 30.0, 120.0)


@pytest.mark.parametrize("lag, expected", [(10, (100.0, 50.0, 140.0)), (120, (540.0, 270.0, 360.0))])
def test_unset_timeouts_follow_the_lag(base, lag, expected):
    assert timeouts({**base, "SYNC_LAG": str(lag), "NUM_TRANSPLANT_TREES": "2"}) == expected


def test_explicit_timeouts_long_enough_are_kept(base):
    env = {**base, "SYNC_LAG": "100", "COORDINATOR_ROUND_INTERVAL": "900", "LIVENESS_TIMEOUT": "600"}
    assert timeouts(env) == (900.0, 230.0, 600.0)  # ROLLOUT_WAIT_TIMEOUT unset: still derived


@pytest.mark.parametrize(
    "var, value, floor, derived",
    [
        ("COORDINATOR_ROUND_INTERVAL", "60", "360", "540"),
        ("LIVENESS_TIMEOUT", "120", "140", "360"),  # the notebooks' value
        ("ROLLOUT_WAIT_TIMEOUT", "30", "240", "270"),  # the notebooks' value
    ],
)
def test_an_explicit_timeout_too_short_for_the_lag_is_refused_naming_both(base, var, value, floor, derived):
    with pytest.raises(ConfigError) as info:
        from_env({**base, "SYNC_LAG": "120", "NUM_TRANSPLANT_TREES": "2", var: value})
    message = str(info.value)
    assert info.value.var == var and message.startswith(f"{var}={float(value)!r}: ")
    assert "SYNC_LAG=120" in message and floor in message
    assert f"unset {var} (derived: {derived} s)" in message


def test_the_worker_wait_must_outlast_a_round_and_the_lag(base):
    with pytest.raises(ConfigError) as info:
        from_env({**base, "SYNC_LAG": "120", "COORDINATOR_WAIT_TIMEOUT": "600"})
    assert info.value.var == "COORDINATOR_WAIT_TIMEOUT" and "SYNC_LAG=120" in str(info.value)
    assert "660" in str(info.value)  # COORDINATOR_ROUND_INTERVAL 540 + SYNC_LAG 120


def test_a_short_rollout_wait_is_fine_without_transplants(base):
    config = from_env({**base, "SYNC_LAG": "120", "ROLLOUT_WAIT_TIMEOUT": "30", "NUM_TRANSPLANT_TREES": "0"})
    assert config.rollout_wait_timeout == 30.0


def test_without_lag_short_explicit_timeouts_are_not_checked(base):
    assert from_env({**base, "COORDINATOR_ROUND_INTERVAL": "1"}).coordinator_round_interval == 1.0


@pytest.mark.parametrize("raw", ["-1", "abc", "nan", "inf", "3601", ""])
def test_bad_lags_are_refused(base, raw):
    with pytest.raises(ConfigError) as info:
        from_env({**base, "SYNC_LAG": raw})
    assert info.value.var == "SYNC_LAG" and "0 for a local folder or the Drive API" in str(info.value)


def test_swarm_gdrive_env_lists_it_with_the_derivation():
    from swarm_gdrive.cli import main

    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        main(["env"])
    assert exit_info.value.code == 0
    text = out.getvalue()
    assert "SYNC_LAG" in text and "default 0.0" in text
    assert "COORDINATOR_ROUND_INTERVAL = 60 + 4 x SYNC_LAG" in " ".join(text.split())
