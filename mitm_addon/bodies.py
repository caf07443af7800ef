"""Content-Encoding decoding with a size bound (pure)."""

from __future__ import annotations

import zlib

import brotli
import zstandard

# Brotli 1.1 has no bound on the output of one ``process`` call, and a few hundred
# bytes can expand to gigabytes. Input therefore goes in pieces small enough that one
# piece cannot overshoot the bound by much: the densest stream brotli's encoder makes
# (zeros, quality 11) gives about 0.5 MiB of output per input byte, so a piece of
# (room left) / 1 MiB bytes keeps the output under about twice the bound.
_BROTLI_BYTES_PER_INPUT_BYTE = 1 << 20
_BROTLI_MIN_PIECE = 16  # 16 input bytes: at most about 8 MiB past the bound
_BROTLI_MAX_PIECE = 1 << 20


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
            out = _decode_brotli(data, limit)
        else:
            raise BodyError(f"unsupported Content-Encoding {coding!r}")
    except (zlib.error, zstandard.ZstdError, brotli.error) as e:
        raise BodyError(f"cannot decode {coding} body: {e}") from e
    if len(out) > limit:
        raise BodyError(f"{coding} body decodes past {limit} bytes")
    return out


def _decode_brotli(data: bytes, limit: int) -> bytes:
    """Brotli with the output checked after each input piece (see _BROTLI_MIN_PIECE)."""
    dec = brotli.Decompressor()
    parts: list[bytes] = []
    size = pos = 0
    while pos < len(data):
        piece = (limit - size) // _BROTLI_BYTES_PER_INPUT_BYTE
        piece = min(max(piece, _BROTLI_MIN_PIECE), _BROTLI_MAX_PIECE)
        part = dec.process(data[pos : pos + piece])
        pos += piece
        parts.append(part)
        size += len(part)
        if size > limit:
            break  # the caller reports it
    return b"".join(parts)
