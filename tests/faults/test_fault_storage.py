"""Storage faults under a running swarm of real processes: EIO / ENOTCONN bursts on the local folder, and on
the Drive API (emulator) 500/503 storms, 403/429 rate limits, dropped connections and listings that lag."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from faultkit import (
    LAYOUT,
    Swarm,
    swarm_env,
)
from trials import run_oserror_trial

from swarm_gdrive.protocol.records import (
    EventRecord,
    MetricRecord,
    RewardRecord,
    RolloutBatch,
    StateRecord,
    decode_lines,
)
from swarm_gdrive.protocol.records import decode as decode_record

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize("round_mode", ["sync", "async"])
def test_bursts_of_eio_and_enotconn_on_every_node_lose_nothing(tmp_path, round_mode):
    injected = run_oserror_trial(tmp_path, seed=0, round_mode=round_mode)
    assert injected["EIO"] >= 10 and injected["ENOTCONN"] >= 10, injected


def test_drive_storms_of_5xx_rate_limits_and_dropped_connections_with_lagging_listings(tmp_path):
    from drive_emulator import FOLDER_MIME, DriveEmulator

    from swarm_gdrive.storage.drive import DriveStorage

    rounds, workers = 3, ["w1", "w2"]
    with DriveEmulator() as emu:
        emu.list_lag_s = 2.0  # a create shows in files.list only 2 s later
        env = {
            **swarm_env(tmp_path / "unused", MAX_ROUNDS=rounds, MIN_WORKERS=2, NUM_TRANSPLANT_TREES=1),
            "GDRIVE_PATH": f"gdrive://{emu.root_id}/swarm",
            "GDRIVE_API_URL": emu.root_url,
            "SWARM_LOCAL_DIR": str(tmp_path / "local"),
            "HEARTBEAT_INTERVAL": "1",
            "LIVENESS_TIMEOUT": "60",
            "ROLLOUT_WAIT_TIMEOUT": "60",
            "POLL_INTERVAL_MIN": "0.1",
            "POLL_INTERVAL_MAX": "0.5",
        }
        halt = threading.Event()
        storms: Counter[str] = Counter()

        def storm() -> None:
            # Every 0.6 s of busy traffic, a burst of one kind: 500, 503, 403 rate limit, 429, or two dropped
            # connections in a row (httplib2 resends one drop silently; two reach the backend).
            kinds = [
                ("500", lambda: emu.fail_next(3, 500, "backendError")),
                ("503", lambda: emu.fail_next(2, 503, "backendError")),
                ("403", lambda: emu.fail_next(3, 403, "userRateLimitExceeded")),
                ("429", lambda: emu.fail_next(3, 429, "rateLimitExceeded")),
                ("drop", lambda: emu.drop_next(2)),
            ]
            i, seen = 0, 0
            while not halt.wait(0.6):
                if len(emu.requests) - seen >= 15:
                    name, inject = kinds[i % len(kinds)]
                    inject()
                    storms[name] += 1
                    i += 1
                seen = len(emu.requests)

        swarm = Swarm(tmp_path, env, workers)
        thread = threading.Thread(target=storm, daemon=True)
        thread.start()
        try:
            swarm.start_all()
            codes = swarm.wait(timeout=300)
        finally:
            halt.set()
            swarm.stop()
        assert codes == {"coord": 0, "w1": 0, "w2": 0}, swarm.tails()
        assert min(storms[k] for k in ("500", "503", "403", "429", "drop")) >= 1, storms

        emu.list_lag_s = 0.0
        storage = DriveStorage(emu.root_id, "swarm", service=emu.service())

        def read(rel, model):
            return decode_record(storage.read_bytes(rel), model)

        state = read(LAYOUT.state_file, StateRecord)
        assert (state.status, state.round) == ("finished", rounds)
        for round_ in range(rounds):
            for w in workers:
                assert read(LAYOUT.reward_file(round_, 0, w), RewardRecord).round == round_
                batch = read(LAYOUT.rollout_file(round_, 0, w), RolloutBatch)
                assert batch.complete and len(batch.groups) == 3
        retries = 0
        for node in ["coord", *workers]:
            events, problems = decode_lines(storage.read_bytes(LAYOUT.events_file(node)), EventRecord)
            assert not problems and not [e for e in events if e.event == "file_rejected"], node
            lines, problems = decode_lines(storage.read_bytes(LAYOUT.metrics_file(node)), MetricRecord)
            assert not problems, node
            retries += sum(m.values.get("storage/backend_retries", 0) for m in lines)
        assert retries > 0
        files = [f for f in emu.files() if not f.get("trashed") and f["mimeType"] != FOLDER_MIME]
        dup = [k for k, n in Counter((tuple(f["parents"]), f["name"]) for f in files).items() if n > 1]
        assert not dup, dup  # a retried upload never left two copies of a file
