"""Compressed request bodies decode, within a bound."""

from __future__ import annotations

import gzip
import zlib

import brotli
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from mitm_addon.bodies import BodyError, decode_body

CODECS = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
    "zstd": lambda b: zstandard.ZstdCompressor().compress(b),
}


@given(st.binary(max_size=5000), st.sampled_from(sorted(CODECS)))
def test_every_encoding_round_trips(data: bytes, coding: str) -> None:
    assert decode_body(CODECS[coding](data), coding, 10_000) == data


def test_a_body_that_decodes_past_the_bound_is_refused() -> None:
    bomb = zstandard.ZstdCompressor().compress(b"\0" * 1_000_000)
    with pytest.raises(BodyError, match="past"):
        decode_body(bomb, "zstd", 1000)


def test_garbage_under_a_known_encoding_is_a_body_error() -> None:
    with pytest.raises(BodyError):
        decode_body(b"not gzip at all", "gzip", 1000)


def test_unknown_encoding_is_a_body_error() -> None:
    with pytest.raises(BodyError, match="unsupported"):
        decode_body(b"x", "compress", 1000)
