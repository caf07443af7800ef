-- token_prefixes: the tokens before a sequence's first prompt delta, for sequences that
-- start at a CLEAN call whose parent's sequence was already extended by another child
-- (token_calls.needs_prefix): the full prompt of the nearest full-prompt ancestor, then
-- each ancestor's completion and the next one's delta, down to the parent's completion.
-- These tokens were trained (or are context) elsewhere: the loss mask is 0 on all of them.
-- Grain: sample_id (unique; only sequences that need a prefix).
CREATE OR REPLACE VIEW token_prefixes AS
WITH RECURSIVE
up(sample_id, call_id, depth) AS (
    SELECT call_id, prompt_parent_call_id, 1 FROM token_calls WHERE needs_prefix
    UNION ALL
    SELECT up.sample_id, c.prompt_parent_call_id, up.depth + 1
    FROM up
    JOIN calls AS c ON c.call_id = up.call_id
    -- Resolved chains only (needs_prefix implies it), so this ends at a full prompt.
    WHERE c.drift = 'CLEAN' AND c.prompt_parent_call_id IS NOT NULL
)
SELECT
    up.sample_id::VARCHAR AS sample_id,
    -- Ancestors from the full-prompt call down to the parent.
    list(up.call_id ORDER BY up.depth DESC)::VARCHAR[] AS ancestor_call_ids,
    flatten(
        list(list_concat(c.prompt_ids, c.completion_ids) ORDER BY up.depth DESC)
    )::INTEGER[] AS prefix_ids
FROM up
JOIN calls AS c ON c.call_id = up.call_id
GROUP BY up.sample_id
