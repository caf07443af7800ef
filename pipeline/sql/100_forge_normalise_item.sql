-- forge_normalise_item(content_json): a conversation item's canonical JSON with what
-- harnesses change when they re-send earlier items taken out, so that an item compares
-- equal to its earlier copy when the exact hashes differ. Grain: one item (scalar macro).
--
-- Removed: cache_control marks (Claude Code moves them to the newest message every turn),
-- internal_chat_message_metadata_passthrough (Codex adds it to echoed output items), the
-- keys id and status (Responses output items echoed with or without them), keys whose
-- value is null or [] (Chat `content: null` versus absent, `refusal`, `annotations`).
-- Rewritten: content made of one text block becomes that string (Claude Code turns a
-- system message's block list into a string; input_text and output_text count as text).
-- It works on canonical JSON text (sorted keys, no spaces; see pipeline.canonical): inside
-- a JSON string every quote is escaped, so the patterns only match real keys. A removed
-- pair takes its comma along (',pair', else 'pair,', else a lone pair): two passes in all.
CREATE OR REPLACE MACRO forge_normalise_item(content_json) AS regexp_replace(
    regexp_replace(
        content_json,
        ',(?:"(?:cache_control|internal_chat_message_metadata_passthrough)":\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\}|"(?:id|status)":"(?:[^"\\]|\\.)*"|"[A-Za-z_]+":(?:null|\[\]))'
        || '|(?:"(?:cache_control|internal_chat_message_metadata_passthrough)":\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\}|"(?:id|status)":"(?:[^"\\]|\\.)*"|"[A-Za-z_]+":(?:null|\[\])),?',
        '',
        'g'
    ),
    '"content":\[\{"text":("(?:[^"\\]|\\.)*"),"type":"(?:input_|output_)?text"\}\]',
    '"content":\1',
    'g'
)
