"""The writer: what reached the WAL reaches the shards, once, even across a crash, whether
the shards are built by a child process (the default) or a thread of the proxy."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from mitm_addon import wal as wal_mod
from mitm_addon.attribution import ProcessInfo
from mitm_addon.capture import Capture
from mitm_addon.config import Config
from mitm_addon.writer import Reserve, Writer, _ChildBuilder
from pipeline.store import connect

WIRE = Path(__file__).resolve().parents[1] / "fixtures" / "wire"
BUILDERS = ["process", "thread"]


def capture(i: int, turns: int = 1) -> Capture:
    messages = []
    for t in range(turns):
        messages += [
            {"role": "user", "content": f"question {t}"},
            {"role": "assistant", "content": f"answer {t}"},
        ]
    body = {
        "model": "claude-test",
        "max_tokens": 100,
        "system": "You are terse.",
        "messages": messages + [{"role": "user", "content": f"call {i}"}],
    }
    return Capture(
        call_id=f"{i:024d}",
        run_id="run-test",
        transport="http",
        method="POST",
        scheme="https",
        host="api.anthropic.com",
        path="/v1/messages",
        started_at=time.time(),
        request_body=json.dumps(body).encode(),
        status_code=200,
        response_headers={"content-type": "application/json"},
        response_body=(WIRE / "anthropic_messages" / "response_text.json").read_bytes(),
        ended_at=time.time(),
    )


def record(w: Writer, *ids: int, turns: int = 1) -> None:
    for i in ids:
        c = capture(i, turns)
        w.begin(c)
        w.end(c, None)


def calls(root: Path, sql: str = "SELECT call_id, status FROM calls ORDER BY call_id") -> list:
    if not any((root / "calls").glob("*.parquet")):
        return []
    return connect(root).execute(sql).fetchall()


def eventually(check: Callable[[], bool], timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


@pytest.mark.parametrize("builder", BUILDERS)
def test_calls_left_in_the_wal_by_a_crash_are_recovered_once(tmp_path: Path, builder: str) -> None:
    config = Config(out_dir=tmp_path, rotate_seconds=3600, builder=builder)
    # A proxy killed mid-run leaves its WAL and nothing else: frames, no builder, no flush.
    crashed = Writer(config, "run-a")
    record(crashed, *range(5))
    crashed.begin(capture(99))  # in flight at the kill
    os.close(crashed.wal.lock_fd)  # the kernel releases a dead process's lock
    recovered = Writer(config, "run-b")
    report = recovered.start()
    recovered.stop()
    assert (report.calls, report.incomplete) == (5, 1)
    rows = calls(tmp_path)
    assert [r[0] for r in rows] == [f"{i:024d}" for i in (0, 1, 2, 3, 4, 99)]
    assert [r[1] for r in rows] == ["complete"] * 5 + ["incomplete"]
    assert list((tmp_path / "wal").glob("*.wal")) == []  # a clean stop leaves no log
    again = Writer(config, "run-c")
    again.start()
    again.stop()
    assert calls(tmp_path, "SELECT count(*) FROM calls") == [(6,)]


@pytest.mark.parametrize("builder", BUILDERS)
def test_a_shared_conversation_prefix_is_stored_once(tmp_path: Path, builder: str) -> None:
    w = Writer(Config(out_dir=tmp_path, builder=builder), "run-a")
    w.start()
    record(w, 0, 1, 2, turns=10)
    w.stop()
    con = connect(tmp_path)
    # 20 shared history items + 3 distinct last questions + 1 shared answer per call + 1 params row
    (items,) = con.execute("SELECT count(*) FROM messages WHERE kind = 'item'").fetchone()
    (params,) = con.execute("SELECT count(*) FROM messages WHERE kind = 'params'").fetchone()
    assert params == 1 and items == 20 + 3 + 3


@pytest.mark.parametrize("builder", BUILDERS)
def test_a_call_reaches_a_shard_while_the_proxy_runs(tmp_path: Path, builder: str) -> None:
    w = Writer(Config(out_dir=tmp_path, rotate_rows=1, builder=builder), "run-a")
    w.start()
    try:
        record(w, 1)
        assert eventually(lambda: calls(tmp_path) == [(f"{1:024d}", "complete")])
    finally:
        w.stop()


@pytest.mark.parametrize("builder", BUILDERS)
def test_no_shard_holds_more_calls_than_rotate_rows(tmp_path: Path, builder: str) -> None:
    w = Writer(Config(out_dir=tmp_path, rotate_rows=2, builder=builder), "run-a")
    w.start()
    record(w, *range(5))  # within one WAL segment, most likely
    w.stop()
    shards = sorted((tmp_path / "calls").glob("*.parquet"))
    sizes = [pq.read_metadata(p).num_rows for p in shards]
    assert sum(sizes) == 5 and max(sizes) <= 2 and len(shards) >= 3
    assert all(pq.read_schema(p).metadata[b"forge.schema_version"] == b"1" for p in shards)


@pytest.mark.parametrize("builder", BUILDERS)
def test_a_lookup_that_ends_after_its_call_still_names_the_process(
    tmp_path: Path, builder: str
) -> None:
    w = Writer(Config(out_dir=tmp_path, builder=builder), "run-a")
    w.start()
    lookup: concurrent.futures.Future[ProcessInfo | None] = concurrent.futures.Future()
    c = capture(1)
    w.begin(c)
    w.end(c, lookup)  # still running: the END frame says so
    time.sleep(1.5)  # a rotation passes: the END frame must be written again, not lost
    lookup.set_result(ProcessInfo(pid=4242, name="claude", parent_pids=[1], rollout_id="r-env"))
    w.stop()
    sql = "SELECT pid, process_name, rollout_id, rollout_source, status FROM calls"
    assert calls(tmp_path, sql) == [(4242, "claude", "r-env", "process_env", "complete")]


def test_endpoint_counts_reach_their_shard(tmp_path: Path) -> None:
    w = Writer(Config(out_dir=tmp_path, builder="thread"), "run-a")
    w.start()
    for _ in range(3):
        w.count_endpoint("api.openai.com", "GET", "/v1/models?x=1", 200)
    w.stop()
    got = connect(tmp_path).execute("SELECT path, status_code, requests FROM endpoints").fetchall()
    assert got == [("/v1/models", 200, 3)]


@pytest.mark.parametrize("builder", BUILDERS)
def test_calls_that_cannot_reach_a_shard_stay_in_the_wal_for_the_next_start(
    tmp_path: Path, builder: str
) -> None:
    config = Config(out_dir=tmp_path, builder=builder)
    (tmp_path / "calls").write_text("a file where the directory should be")
    w = Writer(config, "run-a")
    w.start()
    record(w, 1, 2)
    w.stop()  # the builder tries a few times, then leaves the calls in the log
    assert list((tmp_path / "wal").glob("*.wal"))
    os.unlink(tmp_path / "calls")
    again = Writer(config, "run-b")
    report = again.start()
    again.stop()
    assert report.calls == 2 and [r[1] for r in calls(tmp_path)] == ["complete", "complete"]


def test_a_killed_builder_child_is_started_again_and_loses_nothing(tmp_path: Path) -> None:
    w = Writer(Config(out_dir=tmp_path, rotate_rows=1), "run-a")
    w.start()
    try:
        runner = w._builder
        assert isinstance(runner, _ChildBuilder) and runner.process is not None
        record(w, 1)
        assert eventually(lambda: len(calls(tmp_path)) == 1)
        first = runner.process.pid
        os.kill(first, signal.SIGKILL)
        record(w, 2, 3)
        assert eventually(lambda: runner.process is not None and runner.process.pid != first)
    finally:
        w.stop()
    assert [r[0] for r in calls(tmp_path)] == [f"{i:024d}" for i in (1, 2, 3)]


@pytest.mark.parametrize("python", ["/nonexistent/python3", "/bin/false"])
def test_a_builder_child_that_cannot_run_gives_way_to_a_thread_and_says_so(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    python: str,
) -> None:
    """No interpreter to start (a frozen mitmproxy), or one that dies at once: the calls
    still reach shards, and the log says why the builder is a thread."""
    from mitm_addon import writer as writer_mod

    monkeypatch.setattr(writer_mod.sys, "executable", python)
    w = Writer(Config(out_dir=tmp_path, rotate_rows=1), "run-a")
    w.start()
    try:
        record(w, 1)
        assert eventually(lambda: len(calls(tmp_path)) == 1, timeout_s=30)
    finally:
        w.stop()
    assert "building shards on a thread of the proxy instead" in caplog.text


def test_appends_do_not_wait_for_an_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fsync takes milliseconds; the hooks append under the log's lock on the event loop."""
    log = wal_mod.Wal(tmp_path)
    with log.lock:
        log.append_locked(wal_mod.encode_frame(wal_mod.END, b"{}", b"1"))
    in_fsync, release = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        in_fsync.set()
        release.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(wal_mod.os, "fsync", slow_fsync)
    syncing = threading.Thread(target=log.sync)
    syncing.start()
    assert in_fsync.wait(5)
    t0 = time.monotonic()
    with log.lock:
        log.append_locked(wal_mod.encode_frame(wal_mod.END, b"{}", b"2"))
    waited = time.monotonic() - t0
    release.set()
    syncing.join()
    monkeypatch.undo()
    log.close()
    assert waited < 1.0


def test_reserve_holds_its_blocks_until_given_up_and_is_taken_back_when_space_allows(
    tmp_path: Path,
) -> None:
    path = tmp_path / "reserve"
    reserve = Reserve(path, 1 << 20)
    assert not reserve.held
    assert reserve.take_back()
    assert reserve.held and path.stat().st_blocks * 512 >= 1 << 20
    assert reserve.give_up() and not reserve.held and reserve.spent
    assert path.stat().st_size == 0 and path.stat().st_blocks == 0
    assert not reserve.give_up(), "nothing left to give"
    assert not reserve.take_back(), "tried again at most twice a second"
    assert reserve.take_back(force=True) and reserve.held and not reserve.spent
    reserve.remove()
    assert not path.exists()
    assert Reserve(path, 0).held, "no reserve asked for: nothing to hold"
