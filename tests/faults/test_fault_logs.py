"""A node killed mid-append leaves a partial last line in its log; its successor's lines must survive it."""

from __future__ import annotations

from faultkit import LAYOUT, check_log

from swarm_gdrive.protocol.metrics import NodeLog
from swarm_gdrive.protocol.records import EventRecord, MetricRecord, decode_lines, encode_line
from swarm_gdrive.storage import LocalStorage


def test_a_restarted_node_starts_its_log_on_a_new_line_after_a_torn_one(tmp_path):
    storage = LocalStorage(tmp_path)
    path = tmp_path / LAYOUT.metrics_file("w1")
    path.parent.mkdir(parents=True)
    whole = encode_line(MetricRecord(node_id="w1", round=0, ts=1.0, values={"a": 1}))
    torn = encode_line(MetricRecord(node_id="w1", round=1, ts=2.0, values={"a": 2}))[:40]
    path.write_bytes(whole + torn)  # what a process SIGKILLed in the middle of an append leaves

    log = NodeLog(storage, LAYOUT, "w1")
    log.metric({"a": 3}, round_=1)
    log.flush()
    log.metric({"a": 4}, round_=2)
    log.flush()

    data = path.read_bytes()
    records, problems = decode_lines(data, MetricRecord)
    assert [r.values["a"] for r in records] == [1, 3, 4]  # the successor's lines are all there
    assert len(problems) == 1 and problems[0].startswith("line 2:")  # the fragment, reported once
    assert check_log(data, MetricRecord, torn_ok=True) == []
    assert data.count(b"\n\n") == 0 and data.count(b"\n") == 4  # one separator, on the first append only


def test_a_log_without_a_fragment_gets_only_a_blank_line_that_readers_skip(tmp_path):
    storage = LocalStorage(tmp_path)
    for value in (1, 2):  # two processes, one after the other
        log = NodeLog(storage, LAYOUT, "w1")
        log.metric({"a": value}, round_=value)
        log.flush()
    data = (tmp_path / LAYOUT.metrics_file("w1")).read_bytes()
    records, problems = decode_lines(data, MetricRecord)
    assert [r.values["a"] for r in records] == [1, 2] and not problems


def test_a_coordinator_restarted_after_the_end_records_that_it_resumed(tmp_path):
    from swarm_threads import Node, fast_env, run_threads

    folder = tmp_path / "drive"
    folder.mkdir()
    env = fast_env(folder, LAYOUT.experiment, MAX_ROUNDS=1)
    run_threads(env, workers=1)
    again = Node({**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord"})
    again.start()
    again.join(30)
    assert again.code == 0
    records, _ = decode_lines((tmp_path / "drive" / LAYOUT.events_file("coord")).read_bytes(), EventRecord)
    resumed = [(e.event, e.data) for e in records if e.event == "coordinator_resumed"]
    assert resumed == [("coordinator_resumed", {"status": "finished"})]
