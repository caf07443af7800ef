"""The canonical JSON and hash contract."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.canonical import canonical_json, chain_hashes, item_hash

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values)
def test_key_order_does_not_change_canonical_json(value: object) -> None:
    def reverse(v: object) -> object:
        if isinstance(v, dict):
            return {k: reverse(v[k]) for k in reversed(list(v))}
        if isinstance(v, list):
            return [reverse(x) for x in v]
        return v

    assert canonical_json(reverse(value)) == canonical_json(value)


def test_the_parent_participates_in_the_hash() -> None:
    c = canonical_json({"role": "user", "content": "hi"})
    assert item_hash(c, None) != item_hash(c, item_hash(c, None))


def test_shared_prefixes_share_hashes() -> None:
    a = chain_hashes([{"n": 1}, {"n": 2}, {"n": 3}])
    b = chain_hashes([{"n": 1}, {"n": 2}, {"n": 4}])
    assert a[:2] == b[:2] and a[2][0] != b[2][0]


def test_hash_values_carry_the_algorithm_tag() -> None:
    assert item_hash("{}", None).startswith("m1:") and len(item_hash("{}", None)) == 43


def test_nan_is_refused() -> None:
    with pytest.raises(ValueError):
        canonical_json({"x": math.nan})
