-- rollout_items: the conversation items of each rollout, each once, in the order they
-- entered it: every call contributes its response items (response_items of them back
-- from response_head_hash) and the request items it brought in (back from
-- request_head_hash, stopping before the response of another call of the rollout or an
-- item another call of the rollout stored first: those are already counted).
-- Grain: (rollout_id, hash). seq orders a rollout's items; calls without a rollout_id
-- are left out.
--
-- An item re-sent with changes (Claude Code moves cache_control every turn) has a new
-- hash and appears again; views over it deduplicate by tool call id (tool_events).
CREATE OR REPLACE VIEW rollout_items AS
WITH RECURSIVE
items AS MATERIALIZED (
    SELECT hash, any_value(parent_hash) AS parent_hash, min(first_call_id) AS storer_call_id
    FROM messages
    WHERE kind = 'item'
    GROUP BY hash
),
rc AS MATERIALIZED (
    SELECT
        call_id, rollout_id, started_at, request_head_hash, request_items,
        response_head_hash, response_items
    FROM calls
    WHERE rollout_id IS NOT NULL
),
stored AS MATERIALIZED (
    SELECT i.hash, i.parent_hash, i.storer_call_id, s.rollout_id AS storer_rollout_id
    FROM items AS i
    LEFT JOIN rc AS s ON s.call_id = i.storer_call_id
),
heads AS MATERIALIZED (
    SELECT DISTINCT rollout_id, response_head_hash AS hash
    FROM rc
    WHERE response_head_hash IS NOT NULL
),
-- part 0: request items, part 1: response items; steps back from the head.
walk(call_id, rollout_id, part, hash, steps, remaining) AS (
    SELECT call_id, rollout_id, 1, response_head_hash, 0, response_items - 1
    FROM rc
    WHERE response_head_hash IS NOT NULL AND response_items > 0
    UNION ALL
    SELECT c.call_id, c.rollout_id, 0, c.request_head_hash, 0, c.request_items - 1
    FROM rc AS c
    LEFT JOIN stored AS s ON s.hash = c.request_head_hash
    LEFT JOIN heads AS h ON h.hash = c.request_head_hash AND h.rollout_id = c.rollout_id
    WHERE c.request_head_hash IS NOT NULL AND c.request_items > 0
        AND h.hash IS NULL
        AND NOT (s.storer_call_id <> c.call_id AND s.storer_rollout_id = c.rollout_id)
    UNION ALL
    SELECT w.call_id, w.rollout_id, w.part, p.hash, w.steps + 1, w.remaining - 1
    FROM walk AS w
    JOIN stored AS i ON i.hash = w.hash
    JOIN stored AS p ON p.hash = i.parent_hash
    LEFT JOIN heads AS h ON h.hash = p.hash AND h.rollout_id = w.rollout_id
    WHERE w.remaining > 0
        AND (
            w.part = 1
            OR (
                h.hash IS NULL
                AND NOT (p.storer_call_id <> w.call_id AND p.storer_rollout_id = w.rollout_id)
            )
        )
),
firsts AS (
    SELECT w.rollout_id, w.hash, w.call_id, w.part, w.steps, c.started_at
    FROM walk AS w
    JOIN rc AS c USING (call_id)
    QUALIFY row_number() OVER (
        PARTITION BY w.rollout_id, w.hash
        ORDER BY c.started_at NULLS LAST, w.call_id, w.part, w.steps DESC
    ) = 1
),
content AS (
    SELECT hash, any_value(role) AS role, any_value(item_type) AS item_type,
        any_value(content_json) AS content_json
    FROM messages
    WHERE kind = 'item' AND hash IN (SELECT hash FROM firsts)
    GROUP BY hash
)
SELECT
    f.rollout_id::VARCHAR AS rollout_id,
    f.hash::VARCHAR AS hash,
    -- 1, 2, ... in the order items entered the rollout (call start, request before
    -- response, oldest item first).
    row_number() OVER (
        PARTITION BY f.rollout_id
        ORDER BY f.started_at NULLS LAST, f.call_id, f.part, f.steps DESC
    )::BIGINT AS seq,
    -- The call whose request or response brought the item in.
    f.call_id::VARCHAR AS call_id,
    (CASE f.part WHEN 0 THEN 'request' ELSE 'response' END)::VARCHAR AS part,
    k.role::VARCHAR AS role,
    k.item_type::VARCHAR AS item_type,
    k.content_json::VARCHAR AS content_json
FROM firsts AS f
JOIN content AS k USING (hash)
