"""Files and folders that appear whole or not at all: temporary, fsync, rename, fsync of the folder.

A reader (or a crash) sees either the old ``path`` or the new one, never half of it: the
content is written to a temporary name in the same folder (a rename is atomic only within
one file system), fsynced, and renamed over ``path``; the folder is fsynced after, so the
rename itself survives a power loss. Temporary names start with a dot, so globs such as
``*.parquet`` skip them. ``sync=False`` / ``sync_dir=False`` keep the atomicity but drop
the durability, for files that are cheap to write again (HTML pages, caches).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "atomic_directory",
    "atomic_file",
    "fsync_dir",
    "fsync_file",
    "temporary_path",
    "write_atomic",
]

# O_DIRECTORY makes fsync_dir refuse a file instead of silently syncing it; platforms
# without the flag (Windows) have no directory fsync to do either.
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)


def fsync_dir(path: Path) -> None:
    """fsync the directory ``path``: its entries (a file made, renamed or removed) reach the disk."""
    fd = os.open(path, _DIR_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """fsync the contents of the file ``path``, written earlier by someone else (a library)."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def temporary_path(path: Path) -> Path:
    """A fresh temporary name next to ``path``: ``.<name>.tmp-<8 hex digits>``."""
    return path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def atomic_file(
    path: Path, *, tmp: Path | None = None, sync: bool = True, sync_dir: bool = True
) -> Iterator[BinaryIO]:
    """Yield a binary file that replaces ``path`` when the block ends without an error.

    The file is a temporary (``tmp``, default ``temporary_path(path)``) in ``path``'s
    folder, which must exist. On a clean exit it is flushed and fsynced (``sync``), closed,
    renamed over ``path`` (``os.replace``) and the folder fsynced (``sync_dir``). On an
    error the temporary is removed and ``path`` is left as it was; the error propagates.
    """
    tmp = tmp if tmp is not None else temporary_path(path)
    try:
        with open(tmp, "wb") as f:
            yield f
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # the first error is the one to report
            tmp.unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync_dir(path.parent)


def write_atomic(
    path: Path,
    data: bytes | str,
    *,
    encoding: str = "utf-8",
    tmp: Path | None = None,
    sync: bool = True,
    sync_dir: bool = True,
) -> None:
    """Replace ``path`` with ``data`` (a ``str`` is encoded with ``encoding``) whole or not at all.

    ``tmp``, ``sync`` and ``sync_dir`` are those of ``atomic_file``.
    """
    payload = data.encode(encoding) if isinstance(data, str) else data
    with atomic_file(path, tmp=tmp, sync=sync, sync_dir=sync_dir) as f:
        f.write(payload)


@contextlib.contextmanager
def atomic_directory(path: Path, *, create: bool = True, sync_dir: bool = True) -> Iterator[Path]:
    """Yield a temporary directory that is renamed to ``path`` when the block ends without an error.

    The directory is ``temporary_path(path)``, made here unless ``create`` is false (for a
    writer that makes its own folder). The block fsyncs what it wrote (``fsync_file``,
    ``fsync_dir``); then the directory is renamed (``os.rename``: an existing non-empty
    ``path`` makes it fail) and ``path``'s parent fsynced (``sync_dir``). On an error the
    temporary directory is removed with all it holds; the error propagates.
    """
    tmp = temporary_path(path)
    if create:
        tmp.mkdir()
    try:
        yield tmp
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if sync_dir:
        fsync_dir(path.parent)
