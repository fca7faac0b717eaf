"""The Drive v3 backend through the emulator: Drive's quirks, retries, clear errors and economy."""

from __future__ import annotations

import os
import sys
import time
import urllib.parse

import pytest

from swarm_gdrive.storage import drive as drive_module
from swarm_gdrive.storage.base import FileTooLargeError, StorageUnavailableError
from swarm_gdrive.storage.drive import DriveAuthError, DriveError, DriveStorage, find_credentials, parse_drive_url

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from drive_emulator import DriveEmulator  # noqa: E402

pytestmark = pytest.mark.drive


@pytest.fixture
def emu():
    with DriveEmulator() as emulator:
        yield emulator


def storage_for(emu: DriveEmulator, **kwargs) -> DriveStorage:
    return DriveStorage(emu.root_id, "swarm", service=emu.service(), retry_max_wait=0.02, **kwargs)


def calls(emu: DriveEmulator) -> int:
    return len(emu.requests)


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (403, "userRateLimitExceeded"),
        (403, "rateLimitExceeded"),
        (429, "rateLimitExceeded"),
        (500, "backendError"),
        (503, "backendError"),
    ],
)
def test_transient_errors_are_retried_until_they_pass(emu, status, reason):
    storage = storage_for(emu)
    storage.write_bytes("a/b.json", b"{}")
    emu.fail_next(3, status, reason)
    assert storage.read_bytes("a/b.json") == b"{}"
    assert storage.counters["retries"] >= 3


def test_dropped_connections_are_retried(emu):
    storage = storage_for(emu)
    storage.write_bytes("x.json", b"1")
    emu.drop_next(4)  # httplib2 resends once by itself; the rest is ours
    assert storage.read_bytes("x.json") == b"1"


@pytest.mark.parametrize(
    ("status", "reason", "needle", "error"),
    [
        (403, "insufficientFilePermissions", "share the folder", DriveError),
        (400, "invalid", "rejected the request (400", DriveError),
    ],
)
def test_non_retryable_errors_fail_at_once_with_a_message(emu, status, reason, needle, error):
    storage = storage_for(emu)
    storage.write_bytes("f.json", b"1")
    before = calls(emu)
    emu.fail_next(1, status, reason)
    with pytest.raises(error) as info:
        storage.write_bytes("f.json", b"2")
    assert needle in str(info.value)
    assert calls(emu) == before + 1, "a non-retryable error is not retried"


def test_missing_file_is_file_not_found_and_size_cap_is_checked_before_download(emu):
    storage = storage_for(emu)
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("nope/none.json")
    storage.write_bytes("big.json", b"x" * 5000)
    before = emu.requests[:]
    with pytest.raises(FileTooLargeError):
        storage.read_bytes("big.json", max_bytes=100)
    assert not any("alt=media" in path for _, path in emu.requests[len(before) :])


def test_a_reader_takes_the_newest_of_duplicate_names_and_a_writer_removes_its_own_duplicates(emu):
    writer = storage_for(emu)
    writer.write_bytes("d/peer.json", b"old")
    folder_id = next(f["id"] for f in emu.files() if f["name"] == "d")
    time.sleep(0.01)
    emu.create_file(folder_id, "peer.json", b"newest")
    reader = storage_for(emu)
    assert reader.read_bytes("d/peer.json") == b"newest"
    restarted_writer = storage_for(emu)  # a new process of the file's one writer
    restarted_writer.write_bytes("d/peer.json", b"mine")
    same_name = [f for f in emu.files() if f["name"] == "peer.json" and not f.get("trashed")]
    assert len(same_name) == 1 and emu.content(same_name[0]["id"]) == b"mine"


def test_duplicate_folders_resolve_to_the_oldest_for_everyone(emu):
    first = storage_for(emu)
    first.write_bytes("rounds/r.json", b"1")
    swarm_id = next(f["id"] for f in emu.files() if f["name"] == "swarm")
    emu.create_duplicate_folder(swarm_id, "rounds")
    other = storage_for(emu)
    other.write_bytes("rounds/s.json", b"2")
    assert sorted(i.name for i in first.list("rounds")) == ["r.json", "s.json"]


def test_own_writes_show_in_own_listings_despite_listing_lag(emu):
    emu.list_lag_s = 5.0
    storage = storage_for(emu)
    storage.write_bytes("lag/mine.json", b"1")
    assert [i.name for i in storage.list("lag")] == ["mine.json"]
    assert storage.read_bytes("lag/mine.json") == b"1"
    other = storage_for(emu)
    assert other.list("lag") == []  # another node sees it once Drive's listing catches up


def test_listings_are_economical_and_counted(emu):
    storage = storage_for(emu)
    for i in range(3):
        storage.write_bytes(f"eco/f{i}.json", b"{}")
    before = calls(emu)
    names = [i.name for i in storage.list("eco")]
    for name in names:
        storage.read_bytes(f"eco/{name}")
    new = emu.requests[before:]
    lists = [p for _, p in new if p.startswith("/drive/v3/files?")]
    assert len(lists) == 1 and "pageSize=1000" in lists[0] and "fields=" in lists[0]
    assert len(new) == 1 + 3  # one listing serves the reads: one download per file
    assert storage.counters["api_calls"] >= len(emu.requests) - 1 and storage.counters["bytes_down"] == 6


def test_large_files_go_up_resumable(emu):
    storage = storage_for(emu)
    data = os.urandom(6 * 1024 * 1024)
    storage.write_bytes("ckpt/model.safetensors", data)
    assert any("uploadType=resumable" in p for _, p in emu.requests)
    assert storage.read_bytes("ckpt/model.safetensors", max_bytes=len(data)) == data


def test_drive_urls_and_missing_credentials(monkeypatch):
    assert parse_drive_url("gdrive://1AbCdEfGhIjKlMnOp/rl-swarm/x") == ("1AbCdEfGhIjKlMnOp", "rl-swarm/x")
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    def no_default(**_kwargs):
        raise DefaultCredentialsError("none")

    monkeypatch.setattr(google.auth, "default", no_default)  # never probe a metadata server from a test
    with pytest.raises(DriveAuthError) as info:
        find_credentials(None, None)
    message = str(info.value)
    assert "GOOGLE_APPLICATION_CREDENTIALS" in message and "GDRIVE_TOKEN_FILE" in message and "Colab" in message


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ('{"type": "external_account", "credential_source": {"executable": {"command": "/bin/true"}}}', "type"),
        ("not json", "not a readable JSON key file"),
    ],
)
def test_key_files_other_than_a_service_account_or_user_token_are_refused(tmp_path, content, needle):
    key = tmp_path / "key.json"
    key.write_text(content)
    with pytest.raises(DriveAuthError) as info:
        find_credentials(str(key), None)
    assert needle in str(info.value) and "GOOGLE_APPLICATION_CREDENTIALS" in str(info.value)


def test_retries_exhausted_become_storage_unavailable_and_a_bounded_wait_rides_it_out(emu):
    import threading

    from swarm_gdrive.protocol.polling import Backoff, wait_for
    from swarm_gdrive.storage.base import StorageUnavailableError

    storage = DriveStorage(
        emu.root_id, "swarm", service=emu.service(), retry_attempts=2, retry_max_wait=0.01, min_retry_s=0.0
    )
    storage.write_bytes("s.json", b"1")
    emu.fail_next(2, 503, "backendError")
    with pytest.raises(StorageUnavailableError):
        storage.read_bytes("s.json")
    emu.fail_next(2, 503, "backendError")
    value = wait_for(lambda: storage.read_bytes("s.json"), threading.Event(), 5.0, Backoff(0.01, 0.05))
    assert value == b"1"


def test_removing_a_folder_forgets_only_what_was_under_it(emu):
    storage = storage_for(emu)
    storage.append_bytes("logs/n/metrics.jsonl", b"line 1\n")
    storage.write_bytes("rollouts/round_0/stage_0/n.json", b"{}")
    storage.delete("rollouts/round_0/stage_0/n.json")
    assert storage.remove_empty_dir("rollouts/round_0/stage_0")
    down = storage.counters["bytes_down"]
    storage.append_bytes("logs/n/metrics.jsonl", b"line 2\n")
    assert storage.counters["bytes_down"] == down  # the log's content was kept: the append is one upload
    assert storage.read_bytes("logs/n/metrics.jsonl") == b"line 1\nline 2\n"
    assert [f.name for f in storage.list("rollouts/round_0")] == []  # the parent's listing was refreshed
    storage.write_bytes("rollouts/round_0/stage_0/n.json", b"[]")  # the folder is made again, not a stale id
    assert storage.read_bytes("rollouts/round_0/stage_0/n.json") == b"[]"


def test_each_thread_has_its_own_connection_and_an_unknown_transport_shares_one_under_a_lock(emu):
    import threading

    storage = storage_for(emu)
    storage.write_bytes("t/a.json", b"1")
    mine = storage._http()
    assert mine is storage._http() and mine is not storage.service._http  # reused here, not the client's own
    other: list[object] = []
    thread = threading.Thread(target=lambda: (storage.write_bytes("t/b.json", b"2"), other.append(storage._http())))
    thread.start()
    thread.join()
    assert other and other[0] is not mine and other[0].credentials is mine.credentials
    shared = DriveStorage(emu.root_id, "swarm", service=emu.service(), http_factory=lambda: None)
    assert shared._http() is None and shared.read_bytes("t/b.json") == b"2"  # through the client's connection


def test_folders_made_ahead_cost_one_request_a_level_and_a_write_into_them_one_request(emu):
    coordinator, worker = storage_for(emu), storage_for(emu)
    coordinator.write_bytes("exp/state.json", b"{}")  # both processes have written before the round exists
    worker.write_bytes("exp/peers/w1.json", b"{}")
    before = calls(emu)
    coordinator.make_dirs("exp/rewards/round_3/stage_0")
    made = emu.requests[before:]
    # rewards: a lookup and a create; round_3 and stage_0, under folders it has just made: a create each
    assert [m for m, _ in made].count("POST") == 3 and len(made) == 4
    before = calls(emu)
    coordinator.make_dirs("exp/rewards/round_4/stage_0")  # the next round: rewards is known
    assert [m for m, _ in emu.requests[before:]] == ["GET", "POST", "POST"]
    before = calls(emu)
    worker.write_bytes("exp/rewards/round_3/stage_0/w1.json", b'{"r": 1}')
    wrote = emu.requests[before:]
    # rewards, round_3 and stage_0 looked up (made by another node), then one create: no lookup of an earlier
    # w1.json, since these folders are younger than this process's first write
    assert [m for m, _ in wrote].count("POST") == 1 and len(wrote) == 4
    assert coordinator.read_bytes("exp/rewards/round_3/stage_0/w1.json") == b'{"r": 1}'
    before = calls(emu)
    coordinator.make_dirs("exp/rewards/round_3/stage_0")
    assert calls(emu) == before, "folders it made are known: nothing is asked again"


def test_a_first_write_into_an_older_folder_still_finds_the_file_an_earlier_process_left(emu):
    earlier = storage_for(emu)
    earlier.write_bytes("exp/rewards/round_0/stage_0/w1.json", b"old")
    later = storage_for(emu)  # a restarted node: the folder is older than its first write
    later.write_bytes("exp/peers/w1.json", b"{}")
    later.write_bytes("exp/rewards/round_0/stage_0/w1.json", b"new")
    named = [f for f in emu.files() if f["name"] == "w1.json" and not f.get("trashed")]
    assert len(named) == 2  # the peer file and one reward file: updated in place, not duplicated
    assert storage_for(emu).read_bytes("exp/rewards/round_0/stage_0/w1.json") == b"new"


def test_a_young_folder_is_looked_up_again_less_often_as_it_ages(monkeypatch, emu):
    storage = storage_for(emu)
    storage.write_bytes("exp/r/f.json", b"{}")
    now = [time.time()]
    mono = [time.monotonic()]
    monkeypatch.setattr(drive_module.time, "time", lambda: now[0])
    monkeypatch.setattr(drive_module.time, "monotonic", lambda: mono[0])
    created = now[0]
    # at age 1 s a resolution older than RECHECK_YOUNG_S (2 s) is stale; at age 60 s only one older than 30 s
    assert storage._expired(mono[0] - 2.5, created - 1.0)
    assert not storage._expired(mono[0] - 2.5, created - 60.0)
    assert storage._expired(mono[0] - 31.0, created - 60.0)
    # past YOUNG_FOLDER_S the cache's TTL applies
    assert not storage._expired(mono[0] - 31.0, created - 3600.0)
    assert storage._expired(mono[0] - 61.0, created - 3600.0)


def test_a_round_s_folders_in_both_trees_are_looked_up_together(emu):
    coordinator, worker = storage_for(emu), storage_for(emu)
    for tree in ("rewards", "rollouts"):
        coordinator.make_dirs(f"exp/{tree}/round_2/stage_0")
    worker.write_bytes("exp/peers/w1.json", b"{}")  # the worker has started before round 3's folders are made
    worker.list("exp/rewards")
    worker.list("exp/rollouts")
    for tree in ("rewards", "rollouts"):
        coordinator.make_dirs(f"exp/{tree}/round_3/stage_0")
        coordinator.make_dirs(f"exp/{tree}/round_3/stage_1")
    folders = [f"exp/{tree}/round_3/stage_{s}" for tree in ("rewards", "rollouts") for s in (0, 1)]
    before = calls(emu)
    worker.prefetch_folders(folders)
    lookups = emu.requests[before:]
    # round_3 under both trees in one query, then stage_0 and stage_1 under both round folders: one each
    assert len(lookups) == 3 and all(m == "GET" and " or " in urllib.parse.unquote_plus(p) for m, p in lookups)
    before = calls(emu)
    for folder in folders:
        worker.write_bytes(f"{folder}/w1.json", b"1")
    assert [m for m, _ in emu.requests[before:]] == ["POST"] * 4, "each write is its create"
    assert worker.list("exp/rollouts/round_3/stage_1")[0].name == "w1.json"
    worker.prefetch_folders(["exp/rewards/round_9/stage_0"])  # not made yet: left to the writer
    worker.write_bytes("exp/rewards/round_9/stage_0/w1.json", b"2")
    assert coordinator.read_bytes("exp/rewards/round_9/stage_0/w1.json") == b"2"


def test_after_a_failed_write_the_next_one_looks_for_a_copy_first(emu):
    storage = storage_for(emu, retry_attempts=1, min_retry_s=0)
    storage.write_bytes("exp/peers/w1.json", b"{}")
    storage.make_dirs("exp/rewards/round_0/stage_0")  # younger than the first write: no lookup needed
    emu.fail_next(1, 500, "backendError")
    with pytest.raises(StorageUnavailableError):
        storage.write_bytes("exp/rewards/round_0/stage_0/w1.json", b"1")
    before = calls(emu)
    storage.write_bytes("exp/rewards/round_0/stage_0/w1.json", b"2")
    made = emu.requests[before:]
    assert [m for m, _ in made] == ["GET", "POST"], "a create whose answer was lost may have left a copy"
    storage.make_dirs("exp/rewards/round_0/stage_1")
    before = calls(emu)
    storage.write_bytes("exp/rewards/round_0/stage_1/w1.json", b"3")
    assert [m for m, _ in emu.requests[before:]] == ["POST"], "another path: no lookup"


def _properties(emu: DriveEmulator, name: str) -> dict:
    (resource,) = [f for f in emu.files() if f["name"] == name and not f.get("trashed")]
    return resource.get("properties", {})


def test_a_small_file_travels_in_its_listing_entry_and_the_reader_needs_no_download(emu):
    """A writer puts a small file's bytes in its public properties; another node's listing carries them, checked
    against Drive's md5, so reading costs that listing alone. A large or non-ASCII content clears them."""
    writer, reader = storage_for(emu), storage_for(emu)
    small = b'{"kind":"reward","node_id":"w1","reward":0.5}' * 20  # 920 bytes: 8 properties
    writer.write_bytes("inl/w1.json", small)
    (info,) = reader.list("inl")
    assert info.inline == small and not [p for _, p in emu.requests if "alt=media" in p]  # no download
    assert len(_properties(emu, "w1.json")) == 8

    big = b"x" * (drive_module.INLINE_MAX_BYTES + 1)
    writer.write_bytes("inl/w1.json", big)  # an update by id: the stale copy must go
    assert _properties(emu, "w1.json") == {}
    (info,) = reader.list("inl")
    assert info.inline is None and reader.read_bytes("inl/w1.json", len(big)) == big

    writer.write_bytes("inl/w1.json", b"short")
    assert reader.list("inl")[0].inline == b"short" and _properties(emu, "w1.json") == {"sg00": "short"}
    for awkward in ("caf\u00e9".encode(), b"line\n", b""):
        writer.write_bytes("inl/w1.json", awkward)
        assert reader.list("inl")[0].inline is None and reader.read_bytes("inl/w1.json") == awkward
    assert drive_module.INLINE_MAX_BYTES == 2880


def test_a_listing_copy_unlike_the_content_is_ignored_and_hostile_properties_never_crash(emu):
    """What another writer left in the properties counts only if it is byte for byte the content Drive holds."""
    folder = emu.create_duplicate_folder(emu.root_id, "swarm")
    folder = emu.create_duplicate_folder(folder, "hostile")
    planted = {
        "forged.json": (b'{"a":"garbage"}', {"sg00": '{"a":"genuine"}'}),  # same size, other bytes
        "stale.json": (b'{"a":1,"b":2}', {"sg00": '{"a":1}'}),
        "gap.json": (b"x" * 130, {"sg00": "x" * 120, "sg02": "x" * 10}),  # sg01 missing
        "long.json": (b"y" * 121, {"sg00": "y" * 121}),  # longer than a part may be (Drive would refuse it too)
        "unicode.json": (b"\xc3\xa9", {"sg00": "\u00e9"}),
        "folderish.json": (b"{}", {"sg00": ["{}"]}),
    }
    for name, (data, props) in planted.items():
        emu.create_file(folder, name, data, properties=props)
    reader = storage_for(emu)
    listed = {i.name: i for i in reader.list("hostile")}
    assert set(listed) == set(planted)
    assert all(info.inline is None for info in listed.values())
    assert reader.read_bytes("hostile/forged.json") == b'{"a":"garbage"}'
    # The control: the same planting with the genuine copy is carried.
    emu.create_file(folder, "honest.json", b'{"a":"genuine"}', properties={"sg00": '{"a":"genuine"}'})
    assert {i.name: i.inline for i in reader.list("hostile")}["honest.json"] == b'{"a":"genuine"}'


def test_the_emulator_enforces_drives_property_limits_and_the_scheme_fits_them(emu):
    """The instrument: an encoding over Drive's limits (30 public properties, 124 bytes a key and value) fails
    against the emulator, and the largest content carried inline uses at most that."""
    service = emu.service()
    over = [
        {f"k{i}": "v" for i in range(31)},
        {"k": "v" * 124},  # 125 bytes
    ]
    for props in over:
        with pytest.raises(Exception, match="400|limit"):
            service.files().create(body={"name": "p", "properties": props}).execute()
    service.files().create(body={"name": "p", "properties": {f"k{i:02d}": "v" * 121 for i in range(30)}}).execute()
    service.files().create(body={"name": "p", "properties": {"k": "v" * 123}}).execute()  # 124 bytes: the limit
    storage_for(emu).write_bytes("fit/max.json", b"z" * drive_module.INLINE_MAX_BYTES)
    assert len(_properties(emu, "max.json")) == drive_module.INLINE_PARTS <= 30


@pytest.mark.parametrize(
    "url",
    ["http://proxy.example.com:8080/", "http://10.0.0.5/", "ftp://example.com/", "drive.example.com", "https:///x"],
)
def test_credentials_never_go_to_a_cleartext_or_malformed_api_url(url: str) -> None:
    """GDRIVE_API_URL with credentials: a bearer token for the whole Drive goes there, so only https or this
    machine's loopback; the refusal names the variable and the fix."""
    from swarm_gdrive.storage.drive import build_service, check_credentialed_url

    with pytest.raises(ValueError, match=r"GDRIVE_API_URL=.*https://"):
        check_credentialed_url(url)
    with pytest.raises(ValueError, match="GDRIVE_API_URL"):
        build_service(token_file="/nonexistent/token.json", api_url=url)


@pytest.mark.parametrize(
    "url", ["https://drive-proxy.example.com/", "http://127.0.0.1:8123/", "http://localhost:9/", "http://[::1]:80/"]
)
def test_https_and_loopback_api_urls_may_carry_credentials(url: str) -> None:
    from swarm_gdrive.storage.drive import check_credentialed_url

    check_credentialed_url(url)  # no refusal


def test_a_file_listed_empty_then_rewritten_large_is_not_downloaded_whole(emu):
    """Issue 30 (sizes that lie): a reader whose listing says 0 bytes asks for at most max_bytes + 1 of them, so a
    participant that rewrites its empty file to gigabytes after being listed costs a reader no more than the cap."""
    writer, reader = storage_for(emu), storage_for(emu)
    writer.write_bytes("p/peer.json", b"")
    assert reader.read_bytes("p/peer.json", max_bytes=100) == b""  # listed, and its entry cached, at 0 bytes
    writer.write_bytes("p/peer.json", b"x" * 50_000)
    down = reader.counters["bytes_down"]
    with pytest.raises(FileTooLargeError):
        reader.read_bytes("p/peer.json", max_bytes=100)
    assert reader.counters["bytes_down"] - down <= 101
