"""The write-ahead log: frames survive whole or are skipped whole."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mitm_addon import wal


@given(
    st.lists(st.tuples(st.sampled_from([wal.BEGIN, wal.END]), st.binary(max_size=300)), max_size=8),
    st.integers(min_value=0, max_value=4000),
)
def test_a_torn_tail_never_yields_a_partial_frame(
    frames: list[tuple[int, bytes]], cut: int
) -> None:
    data = b"".join(
        wal.encode_frame(k, b'{"n": %d}' % i, blob) for i, (k, blob) in enumerate(frames)
    )
    got, torn = wal.read_frames(data[:cut])
    assert [(k, b) for k, _, b in got] == frames[: len(got)]
    assert len(got) == len(frames) or cut < len(data)
    assert torn == min(cut, len(data)) - sum(
        len(wal.encode_frame(k, b'{"n": %d}' % i, b)) for i, (k, b) in enumerate(frames[: len(got)])
    )


def test_a_corrupt_frame_is_skipped_and_reading_resumes_at_the_next(tmp_path: Path) -> None:
    good = wal.encode_frame(wal.END, b"{}", b"abc")
    bad = bytearray(wal.encode_frame(wal.END, b"{}", b"xyz"))
    bad[-6] ^= 0xFF
    got, torn = wal.read_frames(good + bytes(bad) + good)
    assert [b for _, _, b in got] == [b"abc", b"abc"] and torn == len(bad)


def test_a_frame_cut_short_mid_segment_loses_only_itself() -> None:
    """A write that fails part way (disk full) leaves a torn frame; later frames still read."""
    first, later = (wal.encode_frame(wal.END, b'{"n": %d}' % i, b"x" * 50) for i in (1, 2))
    cut = wal.encode_frame(wal.END, b'{"n": 9}', b"FWL1" * 40)[:60]  # holds the magic, too
    got, torn = wal.read_frames(first + cut + later)
    assert [h["n"] for _, h, _ in got] == [1, 2] and torn == len(cut)


def test_rotation_opens_a_new_segment_and_remove_keeps_the_live_one(tmp_path: Path) -> None:
    log = wal.Wal(tmp_path)
    with log.lock:
        log.append_locked(wal.encode_frame(wal.END, b"{}", b"1"))
        old = log.rotate_locked()
        log.append_locked(wal.encode_frame(wal.END, b"{}", b"2"))
    log.remove(old)
    assert log.segments() == [log.seq]
    got, _ = wal.read_frames(log.path(log.seq).read_bytes())
    assert [b for _, _, b in got] == [b"2"]
    log.close()


def test_segment_files_are_private(tmp_path: Path) -> None:
    log = wal.Wal(tmp_path)
    assert log.path(log.seq).stat().st_mode & 0o077 == 0
    log.close()


def test_a_second_proxy_on_a_live_log_waits_then_says_who_holds_it(tmp_path: Path) -> None:
    first = wal.Wal(tmp_path)
    with pytest.raises(wal.WalBusy, match=f"pid {os.getpid()}"):
        wal.Wal(tmp_path, lock_wait_s=0.3)
    first.close()
    second = wal.Wal(tmp_path, lock_wait_s=0.3)  # the first let go
    assert second.seq == first.seq + 1
    second.close()


def test_a_successor_waits_longer_than_a_stopping_proxy_can_hold_the_directory() -> None:
    """A loop killed with SIGKILL leaves its proxy stopping (storing every call, up to the
    writer's stop timeout) while the resumed loop starts the next one on the same run: the
    new proxy must outwait it, and be ready before its launcher gives up on it."""
    from mitm_addon import writer
    from mitm_addon.launch import proxy

    assert writer._STOP_TIMEOUT_S + 10 <= wal.LOCK_WAIT_S < proxy._READY_TIMEOUT_S
