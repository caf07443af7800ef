"""The incremental decoder, with the real Qwen3 tokenizer: the text it writes as ids
arrive is, in the end, the completion's text decoded whole, however the ids are cut."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mitm_addon.serve.renderer import Renderer
from rl.tiny_model import qwen3_tokenizer_dir

EOS = 151645  # <|im_end|>


@pytest.fixture(scope="module")
def renderer() -> Iterator[Renderer]:
    yield Renderer(qwen3_tokenizer_dir())


# Any ids: byte-level pieces that split characters (emoji, CJK), special tokens, EOS.
ids = st.lists(
    st.one_of(st.integers(min_value=0, max_value=151642), st.sampled_from([EOS, 151644, 151667])),
    max_size=40,
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ids, st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=10), st.booleans())
def test_text_written_as_ids_arrive_is_the_completion_decoded_whole(
    renderer: Renderer, completion: list[int], steps: list[int], ends: bool
) -> None:
    completion = completion + [EOS] if ends else completion
    decoder = renderer.decoder()
    written, at, n = [], 0, 0
    while at < len(completion):
        step = steps[n % len(steps)]
        delta = decoder.feed(completion[at : at + step])
        assert "\ufffd" not in delta[-1:]  # never half a character at the end
        written.append(delta)
        at, n = at + step, n + 1
    written.append(decoder.finish())
    assert "".join(written) == renderer.decode(completion)


def test_a_split_character_waits_for_its_last_byte_and_an_end_of_turn_is_never_written(
    renderer: Renderer,
) -> None:
    emoji = renderer.encode("𓀀")  # three byte-level pieces
    assert len(emoji) == 3
    decoder = renderer.decoder()
    assert decoder.feed(emoji[:-1]) == ""
    assert decoder.feed(emoji[-1:]) == "𓀀"
    assert decoder.feed([EOS]) == "" and decoder.finish() == ""
