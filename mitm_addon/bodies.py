"""Content-Encoding decoding with a size bound (pure)."""

from __future__ import annotations

import zlib

import brotli
import zstandard


class BodyError(ValueError):
    """A body that cannot be decoded, or that decodes past the size bound."""


def decode_body(data: bytes, encoding: str | None, limit: int) -> bytes:
    """``data`` decoded per Content-Encoding (zstd, gzip, deflate, br; a list applies right to left)."""
    if not encoding:
        return data
    codings = [c.strip().lower() for c in encoding.split(",") if c.strip()]
    for coding in reversed(codings):
        data = _decode_one(data, coding, limit)
    return data


def _decode_one(data: bytes, coding: str, limit: int) -> bytes:
    if coding in ("identity", ""):
        return data
    try:
        if coding in ("gzip", "x-gzip"):
            out = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, limit + 1)
        elif coding == "deflate":
            try:  # RFC 9110 deflate is zlib-wrapped; some clients send raw deflate
                out = zlib.decompressobj(zlib.MAX_WBITS).decompress(data, limit + 1)
            except zlib.error:
                out = zlib.decompressobj(-zlib.MAX_WBITS).decompress(data, limit + 1)
        elif coding == "zstd":
            reader = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True)
            out = reader.read(limit + 1)
        elif coding == "br":
            dec = brotli.Decompressor()
            out = dec.process(data)  # brotli has no output bound; check after
        else:
            raise BodyError(f"unsupported Content-Encoding {coding!r}")
    except (zlib.error, zstandard.ZstdError, brotli.error) as e:
        raise BodyError(f"cannot decode {coding} body: {e}") from e
    if len(out) > limit:
        raise BodyError(f"{coding} body decodes past {limit} bytes")
    return out
