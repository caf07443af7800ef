"""Files and folders that appear whole or not at all (pipeline.atomic)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pipeline.atomic import (
    atomic_directory,
    atomic_file,
    fsync_dir,
    fsync_file,
    temporary_path,
    write_atomic,
)


class Boom(Exception):
    pass


def record_io(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Log each fsync (of a "file" or a "dir") and each rename, in order."""
    events: list[str] = []
    real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

    def fsync(fd: int) -> None:
        events.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append("replace")
        real_replace(src, dst)

    def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append("rename")
        real_rename(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "rename", rename)
    return events


# -- write_atomic / atomic_file --------------------------------------------------------


def test_a_write_gives_the_file_exactly_the_new_bytes(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(b"old and longer than the new content")
    write_atomic(path, b"new")
    assert path.read_bytes() == b"new"


def test_a_str_is_written_as_utf8_unless_told_otherwise(tmp_path: Path) -> None:
    write_atomic(tmp_path / "a.txt", "café\n")
    write_atomic(tmp_path / "b.txt", "café\n", encoding="latin-1")
    assert (tmp_path / "a.txt").read_bytes() == b"caf\xc3\xa9\n"
    assert (tmp_path / "b.txt").read_bytes() == b"caf\xe9\n"


def test_no_temporary_file_is_left_after_a_write(tmp_path: Path) -> None:
    write_atomic(tmp_path / "page.html", "<p>hi</p>")
    write_atomic(tmp_path / "page.html", "<p>again</p>", sync=False, sync_dir=False)
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]


def test_a_failed_write_leaves_the_old_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "shard.parquet"
    path.write_bytes(b"old")
    with pytest.raises(Boom), atomic_file(path) as f:
        f.write(b"half of the new")
        raise Boom
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["shard.parquet"]


def test_a_failed_first_write_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(Boom), atomic_file(tmp_path / "new.parquet") as f:
        f.write(b"partial")
        raise Boom
    assert list(tmp_path.iterdir()) == []


def test_readers_see_the_old_file_until_the_block_ends(tmp_path: Path) -> None:
    path = tmp_path / "index.html"
    path.write_bytes(b"old")
    with atomic_file(path) as f:
        f.write(b"new")
        f.flush()
        assert path.read_bytes() == b"old"
    assert path.read_bytes() == b"new"


def test_a_given_temporary_name_is_the_one_written_then_renamed(tmp_path: Path) -> None:
    tmp = tmp_path / ".s1.parquet.tmp"
    with atomic_file(tmp_path / "s1.parquet", tmp=tmp) as f:
        f.write(b"rows")
        assert [p.name for p in tmp_path.iterdir()] == [".s1.parquet.tmp"]
    assert [p.name for p in tmp_path.iterdir()] == ["s1.parquet"]


def test_a_given_temporary_name_is_removed_when_the_write_fails(tmp_path: Path) -> None:
    with pytest.raises(Boom), atomic_file(tmp_path / "s1.parquet", tmp=tmp_path / ".t") as f:
        f.write(b"rows")
        raise Boom
    assert list(tmp_path.iterdir()) == []


def test_a_durable_write_fsyncs_the_file_then_renames_then_fsyncs_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = record_io(monkeypatch)
    write_atomic(tmp_path / "f", b"x")
    assert events == ["fsync file", "replace", "fsync dir"]


def test_sync_dir_false_skips_only_the_folder_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = record_io(monkeypatch)
    write_atomic(tmp_path / "f", b"x", sync_dir=False)
    assert events == ["fsync file", "replace"]


def test_a_write_without_sync_renames_without_any_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = record_io(monkeypatch)
    write_atomic(tmp_path / "f", b"x", sync=False, sync_dir=False)
    assert events == ["replace"]
    assert (tmp_path / "f").read_bytes() == b"x"


def test_a_missing_folder_raises_file_not_found_and_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "absent" / "f", b"x")
    assert list(tmp_path.iterdir()) == []


def test_the_write_error_is_raised_even_when_the_cleanup_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unlink(self: Path, missing_ok: bool = False) -> None:
        raise PermissionError("read-only folder")

    monkeypatch.setattr(Path, "unlink", unlink)
    with pytest.raises(Boom), atomic_file(tmp_path / "f"):
        raise Boom


# -- temporary_path --------------------------------------------------------------------


def test_temporary_names_are_hidden_fresh_and_in_the_same_folder(tmp_path: Path) -> None:
    a, b = temporary_path(tmp_path / "s001"), temporary_path(tmp_path / "s001")
    assert a != b
    assert a.parent == b.parent == tmp_path
    assert a.name.startswith(".s001.tmp-") and len(a.name) == len(".s001.tmp-") + 8
    assert int(a.name.rsplit("-", 1)[1], 16) >= 0  # hex digits


# -- fsync_dir / fsync_file ------------------------------------------------------------


def test_fsync_dir_syncs_a_directory_and_closes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[int] = []
    real_close = os.close

    def close(fd: int) -> None:
        closed.append(fd)
        real_close(fd)

    events = record_io(monkeypatch)
    monkeypatch.setattr(os, "close", close)
    fsync_dir(tmp_path)
    assert events == ["fsync dir"] and len(closed) == 1


def test_fsync_dir_closes_the_directory_when_fsync_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[int] = []
    real_close = os.close

    def fsync(fd: int) -> None:
        raise OSError(5, "I/O error")

    def close(fd: int) -> None:
        closed.append(fd)
        real_close(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "close", close)
    with pytest.raises(OSError, match="I/O error"):
        fsync_dir(tmp_path)
    assert len(closed) == 1


@pytest.mark.skipif(not hasattr(os, "O_DIRECTORY"), reason="no O_DIRECTORY here")
def test_fsync_dir_refuses_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(NotADirectoryError):
        fsync_dir(tmp_path / "f")


def test_fsync_file_syncs_a_file_a_library_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    events = record_io(monkeypatch)
    fsync_file(tmp_path / "model.safetensors")
    assert events == ["fsync file"]
    assert (tmp_path / "model.safetensors").read_bytes() == b"weights"


# -- atomic_directory ------------------------------------------------------------------


def test_a_directory_appears_only_when_its_block_ends(tmp_path: Path) -> None:
    out = tmp_path / "s001"
    with atomic_directory(out) as tmp:
        assert tmp.is_dir() and tmp.parent == tmp_path and tmp.name.startswith(".s001.tmp-")
        (tmp / "data").mkdir()
        (tmp / "data" / "train.parquet").write_bytes(b"rows")
        assert not out.exists()
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "data",
        "data/train.parquet",
    ]
    assert (out / "data" / "train.parquet").read_bytes() == b"rows"
    assert [p.name for p in tmp_path.iterdir()] == ["s001"]


def test_a_failed_directory_leaves_nothing_behind(tmp_path: Path) -> None:
    with pytest.raises(Boom), atomic_directory(tmp_path / "s001") as tmp:
        (tmp / "manifest.json").write_text("{}")
        (tmp / "manifest.json").chmod(stat.S_IRUSR)
        raise Boom
    assert list(tmp_path.iterdir()) == []


def test_a_directory_is_not_renamed_over_a_non_empty_one(tmp_path: Path) -> None:
    out = tmp_path / "step-1"
    out.mkdir()
    (out / "forge.json").write_text('{"policy_version": 1}')
    with pytest.raises(OSError), atomic_directory(out) as tmp:
        (tmp / "forge.json").write_text('{"policy_version": 2}')
    assert (out / "forge.json").read_text() == '{"policy_version": 1}'
    assert [p.name for p in tmp_path.iterdir()] == ["step-1"]


def test_create_false_leaves_making_the_directory_to_the_writer(tmp_path: Path) -> None:
    out = tmp_path / "ckpt"
    with atomic_directory(out, create=False) as tmp:
        assert not tmp.exists()
        tmp.mkdir()
        (tmp / "config.json").write_text("{}")
    assert [p.name for p in out.iterdir()] == ["config.json"]


def test_a_directory_is_renamed_then_its_parent_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = record_io(monkeypatch)
    with atomic_directory(tmp_path / "a"):
        pass
    with atomic_directory(tmp_path / "b", sync_dir=False):
        pass
    assert events == ["rename", "fsync dir", "rename"]
