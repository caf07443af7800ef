"""The rules that keep what is not conversation out of prompts and splice keys."""

from __future__ import annotations

from pipeline.export import to_openai
from pipeline.volatile import drop_system_block, has_transient, without_transient

BILLING = (
    "x-anthropic-billing-header: cc_version=2.1.332.4a9; cc_entrypoint=sdk-cli; cch=22b4f; "
    "cc_prompt_id=525b72b9-58df-4a9a-ba96-95f64808892e; cc_turn_index=1;"
)
CONTEXT = (
    "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nactive exec sessions: none\n"
    "<<<END_OPENCLAW_INTERNAL_CONTEXT>>>"
)


def test_the_billing_header_block_is_left_out_of_the_system_prompt() -> None:
    params = {
        "system": [
            {"type": "text", "text": BILLING},
            {
                "type": "text",
                "text": "You are a Claude agent.",
                "cache_control": {"type": "ephemeral"},
            },
        ]
    }
    messages, _ = to_openai("anthropic_messages", params, [{"role": "user", "content": "hi"}])
    assert messages == [
        {"role": "system", "content": "You are a Claude agent."},
        {"role": "user", "content": "hi"},
    ]


def test_only_a_block_that_starts_with_the_header_is_an_attribute() -> None:
    assert drop_system_block(BILLING) is True
    assert drop_system_block("Mention x-anthropic-billing-header: in a sentence.") is False


def test_transient_context_is_cut_out_of_the_text_around_it() -> None:
    assert has_transient(CONTEXT) is True
    assert without_transient(CONTEXT) == ""
    assert without_transient(f"run the tests\n\n{CONTEXT}") == "run the tests"
    assert has_transient("<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>> unterminated") is False
