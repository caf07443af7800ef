"""The writer: what reached the WAL reaches the shards, once, even across a crash."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow.parquet as pq

from mitm_addon.capture import Capture
from mitm_addon.config import Config
from mitm_addon.writer import Writer
from pipeline.store import connect

WIRE = Path(__file__).resolve().parents[1] / "fixtures" / "wire"


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


def test_calls_left_in_the_wal_by_a_crash_are_recovered_once(tmp_path: Path) -> None:
    config = Config(out_dir=tmp_path, rotate_seconds=3600)
    crashed = Writer(config, "run-a")
    crashed.start()
    for i in range(5):
        c = capture(i)
        crashed.begin(c)
        crashed.end(c, None)
    in_flight = capture(99)
    crashed.begin(in_flight)
    # No stop(): the process "dies" here, its worker thread with it, and the kernel
    # releases its lock on the log.
    os.close(crashed.wal._lock_fd)
    crashed.wal._lock_fd = -1
    recovered = Writer(config, "run-b")
    report = recovered.start()
    recovered.stop()
    assert (report.calls, report.incomplete) == (5, 1)
    rows = (
        connect(tmp_path).execute("SELECT call_id, status FROM calls ORDER BY call_id").fetchall()
    )
    assert [r[0] for r in rows] == [f"{i:024d}" for i in (0, 1, 2, 3, 4, 99)]
    assert [r[1] for r in rows] == ["complete"] * 5 + ["incomplete"]
    assert list((tmp_path / "wal").glob("*.wal")) == [recovered.wal.path(recovered.wal.seq)]
    again = Writer(config, "run-c")
    again.start()
    again.stop()
    assert connect(tmp_path).execute("SELECT count(*) FROM calls").fetchone() == (6,)


def test_a_shared_conversation_prefix_is_stored_once(tmp_path: Path) -> None:
    w = Writer(Config(out_dir=tmp_path), "run-a")
    w.start()
    for i in range(3):
        c = capture(i, turns=10)
        w.begin(c)
        w.end(c, None)
    w.stop()
    con = connect(tmp_path)
    # 20 shared history items + 3 distinct last questions + 1 shared answer per call + 1 params row
    (items,) = con.execute("SELECT count(*) FROM messages WHERE kind = 'item'").fetchone()
    (params,) = con.execute("SELECT count(*) FROM messages WHERE kind = 'params'").fetchone()
    assert params == 1 and items == 20 + 3 + 3


def test_shards_rotate_by_rows(tmp_path: Path) -> None:
    w = Writer(Config(out_dir=tmp_path, rotate_rows=2), "run-a")
    w.start()
    for i in range(5):
        c = capture(i)
        w.begin(c)
        w.end(c, None)
        time.sleep(0.3)  # let the worker see the row count before the next call
    w.stop()
    shards = sorted((tmp_path / "calls").glob("*.parquet"))
    assert len(shards) >= 3
    assert sum(pq.read_metadata(p).num_rows for p in shards) == 5
    assert all(pq.read_schema(p).metadata[b"forge.schema_version"] == b"1" for p in shards)


def test_a_write_error_keeps_rows_for_the_next_flush(tmp_path: Path) -> None:
    w = Writer(Config(out_dir=tmp_path, rotate_seconds=3600), "run-a")
    w.start()
    c = capture(1)
    w.begin(c)
    w.end(c, None)
    calls_dir = tmp_path / "calls"
    calls_dir.write_text("a file where the directory should be")
    w._request_flush()
    time.sleep(0.5)
    assert w.last_error and "cannot write shards" in w.last_error
    os.unlink(calls_dir)
    w.stop()
    assert connect(tmp_path).execute("SELECT count(*) FROM calls").fetchone() == (1,)


def test_the_worker_is_not_woken_for_each_call_but_is_for_a_flush_or_a_backlog() -> None:
    from mitm_addon import writer as writer_mod

    inbox = writer_mod._Inbox()
    inbox.put(("call", 1, None), wake=False)
    t0 = time.monotonic()
    assert inbox.take(0.3) == [("call", 1, None)]
    assert time.monotonic() - t0 >= 0.25  # a call alone waits for the batch timer

    inbox.put(("call", 2, None), wake=False)
    inbox.put(("flush", 7, None))
    t0 = time.monotonic()
    assert inbox.take(5.0) == [("call", 2, None), ("flush", 7, None)]
    assert time.monotonic() - t0 < 2.0

    for i in range(writer_mod._BATCH_CALLS):
        inbox.put(("call", i, None), wake=False)
    t0 = time.monotonic()
    assert len(inbox.take(5.0)) == writer_mod._BATCH_CALLS
    assert time.monotonic() - t0 < 2.0


def test_the_first_flush_imports_nothing(tmp_path: Path) -> None:
    """An import in the worker's first flush (Arrow's of pandas: half a second) holds the
    GIL that the hooks need. A fresh interpreter, so that no other test's imports hide one."""
    import subprocess
    import sys

    script = f"""
import sys
from pathlib import Path
from tests.mitm_addon.test_writer import capture
from mitm_addon.config import Config
from mitm_addon.writer import Writer
w = Writer(Config(out_dir=Path({str(tmp_path / "run")!r})), "run-test")
w.start()
before = set(sys.modules)
w._add_rows(capture(1))
w._flush(None)
assert w.calls_written == 1
w.stop()
print(sorted(set(sys.modules) - before))
"""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
