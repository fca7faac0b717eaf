"""What the notebooks' readers (show_summary, show_status) and `swarm-gdrive status` read, on every backend: a
finished run, copied file by file into the backend, reads the same there as on the local folder it ran on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from swarm_gdrive.observe.monitor import load, summary_table
from swarm_gdrive.storage import LocalStorage

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from swarm_threads import fast_env, run_threads  # noqa: E402

EXPERIMENT = "readers"


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished synthetic run (coordinator and 2 workers as threads, 2 rounds, J=1) on a local folder."""
    folder = tmp_path_factory.mktemp("finished") / "shared"
    folder.mkdir()
    run_threads(fast_env(folder, EXPERIMENT, MIN_WORKERS=2, MAX_ROUNDS=2, NUM_TRANSPLANT_TREES=1), 2)
    return folder


def test_the_reward_summary_and_the_status_read_the_same_on_every_backend(backend, finished):
    for path in sorted(p for p in finished.rglob("*") if p.is_file()):
        backend.storage.write_bytes(path.relative_to(finished).as_posix(), path.read_bytes())
    expected = summary_table(LocalStorage(finished), EXPERIMENT)
    assert expected.splitlines()[0].split() == ["node", "round", "0", "round", "1"]
    assert [line.split()[0] for line in expected.splitlines()[1:]] == ["w1", "w2"]
    assert "(1 ext)" in expected

    reader = backend.reopen()  # another node's handle: nothing cached from the writes
    assert summary_table(reader, EXPERIMENT) == expected
    snapshot = load(reader, EXPERIMENT)
    assert snapshot.state.iloc[0]["status"] == "finished" and sorted(set(snapshot.rewards["node"])) == ["w1", "w2"]
