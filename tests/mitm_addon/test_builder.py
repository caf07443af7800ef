"""The shard builder: WAL frames in, each call's rows out once, segments deleted only
when what they hold is stored; and its child process, which the proxy alone stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mitm_addon import builder as builder_mod
from mitm_addon import wal
from mitm_addon.capture import Capture, dumps
from pipeline.store import connect
from tests.mitm_addon.test_writer import capture

ROOT = Path(__file__).resolve().parents[2]


def settings(tmp_path: Path, **kw: object) -> builder_mod.Settings:
    return builder_mod.Settings(root=tmp_path, run_id="run-a", **kw)  # type: ignore[arg-type]


def end_frame(c: Capture, **extra: object) -> bytes:
    header, blob = c.to_frame()
    return wal.encode_frame(wal.END, dumps({**header, **extra}), blob)


def write_segment(tmp_path: Path, seq: int, *frames: bytes) -> None:
    (tmp_path / "wal").mkdir(exist_ok=True)
    wal.segment_path(tmp_path / "wal", seq).write_bytes(b"".join(frames))


def rows(tmp_path: Path, sql: str = "SELECT call_id, status, pid FROM calls ORDER BY 1") -> list:
    return connect(tmp_path).execute(sql).fetchall()


def test_an_end_written_again_at_a_rotation_is_stored_once(tmp_path: Path) -> None:
    c = capture(1)
    write_segment(tmp_path, 1, end_frame(c))
    write_segment(tmp_path, 2, end_frame(c))
    report = builder_mod.recover(settings(tmp_path), before_segment=3)
    assert report.calls == 1 and rows(tmp_path) == [(c.call_id, "complete", None)]
    assert wal.list_segments(tmp_path / "wal") == []


def test_an_end_waits_for_its_proc_frame_in_a_later_segment(tmp_path: Path) -> None:
    c = capture(1)
    proc = {"call_id": c.call_id, "pid": 77, "process_name": "codex", "parent_pids": [1]}
    write_segment(tmp_path, 1, end_frame(c, process_pending=True))
    write_segment(
        tmp_path,
        2,
        end_frame(c, process_pending=True),  # the proxy writes it again into each segment
        wal.encode_frame(wal.PROC, dumps(proc), b""),
    )
    b = builder_mod.Builder(settings(tmp_path))
    b.load()
    b.read_segment(1)
    assert b.flush() and not (tmp_path / "calls").exists()  # not stored yet: it waits
    b.read_segment(2)
    assert b.flush()
    assert rows(tmp_path) == [(c.call_id, "complete", 77)]


def test_an_end_whose_proc_never_comes_is_stored_without_its_process(tmp_path: Path) -> None:
    c = capture(1)
    write_segment(tmp_path, 1, end_frame(c, process_pending=True))
    b = builder_mod.Builder(settings(tmp_path))
    b.load()
    b.read_segment(1)
    b.expire_waiting(time.monotonic() + builder_mod._PROCESS_WAIT_S + 1)
    assert b.flush() and rows(tmp_path) == [(c.call_id, "complete", None)]


def test_a_restarted_builder_never_replaces_a_shard(tmp_path: Path) -> None:
    for n in (1, 2):
        write_segment(tmp_path, n, end_frame(capture(n)))
        builder_mod.recover(settings(tmp_path), before_segment=n + 1)
    names = sorted(p.name for p in (tmp_path / "calls").glob("*.parquet"))
    assert names == ["run-a-000001.parquet", "run-a-000002.parquet"]
    assert len(rows(tmp_path)) == 2


def test_a_frame_it_cannot_use_is_skipped_and_its_segment_kept(tmp_path: Path) -> None:
    bad = wal.encode_frame(wal.END, b'{"no_call_id": 1}', b"")
    write_segment(tmp_path, 1, bad, end_frame(capture(1)))
    report = builder_mod.recover(settings(tmp_path), before_segment=2)
    assert report.calls == 1 and len(rows(tmp_path)) == 1
    assert wal.list_segments(tmp_path / "wal") == [1]  # kept for whoever looks into it


def test_a_write_error_keeps_rows_for_the_next_flush(tmp_path: Path) -> None:
    write_segment(tmp_path, 1, end_frame(capture(1)))
    b = builder_mod.Builder(settings(tmp_path))
    b.load()
    b.read_segment(1)
    (tmp_path / "calls").write_text("a file where the directory should be")
    assert not b.flush()
    assert b.last_error and "cannot write shards" in b.last_error
    assert wal.list_segments(tmp_path / "wal") == [1]
    os.unlink(tmp_path / "calls")
    assert b.flush() and len(rows(tmp_path)) == 1 and b.last_error is None
    assert wal.list_segments(tmp_path / "wal") == []


def test_the_first_flush_imports_nothing(tmp_path: Path) -> None:
    """An import in the first flush (Arrow's of pandas: half a second) would hold the GIL
    the hooks need when the builder is a thread of the proxy. A fresh interpreter, so that
    no other test's imports hide one."""
    script = f"""
import sys
from pathlib import Path
from tests.mitm_addon.test_writer import capture
from mitm_addon.builder import Builder, Settings
b = Builder(Settings(root=Path({str(tmp_path / "run")!r}), run_id="run-test"))
b.load()
before = set(sys.modules)
b.add_capture(capture(1))
assert b.flush() and b.calls_written == 1
print(sorted(set(sys.modules) - before))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def start_child(tmp_path: Path) -> subprocess.Popen[bytes]:
    (tmp_path / "wal").mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "mitm_addon.builder", *settings(tmp_path, rotate_rows=1).argv()],
        stdin=subprocess.PIPE,
        cwd=ROOT,
    )


def test_the_child_stores_every_segment_and_exits_when_told_to_finish(tmp_path: Path) -> None:
    write_segment(tmp_path, 1, end_frame(capture(1)))
    begin = wal.encode_frame(wal.BEGIN, dumps(capture(2).begin_header()), b"")
    write_segment(tmp_path, 2, begin)  # the proxy's last segment: a call still in flight
    child = start_child(tmp_path)
    assert child.stdin is not None
    child.stdin.write(b"finish\n")
    child.stdin.close()
    assert child.wait(60) == 0
    assert [r[1] for r in rows(tmp_path)] == ["complete", "incomplete"]
    assert wal.list_segments(tmp_path / "wal") == []


def test_the_child_ignores_group_signals_and_leaves_the_wal_when_the_proxy_dies(
    tmp_path: Path,
) -> None:
    write_segment(tmp_path, 1, end_frame(capture(1)))
    write_segment(tmp_path, 2, b"")  # live: the proxy is still writing it
    child = start_child(tmp_path)
    assert child.stdin is not None
    deadline = time.monotonic() + 60
    while not (tmp_path / "calls").is_dir() and time.monotonic() < deadline:
        time.sleep(0.1)  # the closed segment's call reaches a shard
    for sig in (signal.SIGINT, signal.SIGTERM):
        child.send_signal(sig)
    time.sleep(0.5)
    assert child.poll() is None, "a signal to the group stopped the builder"
    child.stdin.close()  # what the proxy's death does to the pipe
    assert child.wait(10) == 3
    assert wal.list_segments(tmp_path / "wal") == [2]  # the live one: for the next recovery
    assert len(rows(tmp_path)) == 1


@pytest.mark.parametrize("argv", [["--dir"], ["--run-id", "r"], ["--dir", "d", "--rotate-rows", "x"]])
def test_the_child_refuses_bad_arguments(argv: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mitm_addon.builder", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 2 and "usage: python -m mitm_addon.builder" in out.stderr


def responses_capture(
    call_id: str, items: list[dict[str, object]], response: dict[str, object], **body: object
) -> Capture:
    return Capture(
        call_id=call_id,
        run_id="run-a",
        transport="http",
        method="POST",
        scheme="https",
        host="api.openai.com",
        path="/v1/responses",
        started_at=time.time(),
        request_body=json.dumps({"model": "gpt-5.5", "input": items, **body}).encode(),
        status_code=200,
        response_headers={"content-type": "application/json"},
        response_body=json.dumps(response).encode(),
        ended_at=time.time(),
    )


def test_a_call_after_a_prewarm_continues_the_prewarms_items(tmp_path: Path) -> None:
    """Codex's warm-up (generate: false) carries the base instructions and answers with no
    output; the next call names it in previous_response_id and sends only its new items.
    Its conversation still starts with the instructions."""
    base = {"type": "message", "role": "developer", "content": "You are Codex."}
    ask = {"type": "message", "role": "user", "content": "Say hi."}
    prewarm = responses_capture(
        "0" * 23 + "1", [base], {"id": "resp_w", "object": "response", "output": []},
        generate=False,
    )  # fmt: skip
    answer = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}
    call = responses_capture(
        "0" * 23 + "2", [ask], {"id": "resp_c", "object": "response", "output": [answer]},
        previous_response_id="resp_w",
    )  # fmt: skip
    write_segment(tmp_path, 1, end_frame(prewarm), end_frame(call))
    builder_mod.recover(settings(tmp_path), before_segment=2)
    con = connect(tmp_path, stitched=True)
    from pipeline.export import iter_sft_examples

    (example,) = list(iter_sft_examples(con))
    assert example["messages"] == [
        {"role": "system", "content": "You are Codex."},
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "hi"},
    ]
