-- stitch_links: every call (all columns of stitch_calls) with the earlier call of its
-- rollout whose conversation it extends (parent_call_id, NULL when none) and the evidence:
--   previous_response_id  the request names that call's response (Responses API); it wins;
--   hash_chain            that call's response is on the request's hash chain;
--   normalised_chain      the harness re-sent that call's response re-chained or altered
--                         (cache_control moved, ids or status dropped, content:null
--                         absent): the item at the position of its response's last item
--                         equals that call's, as is or after forge_normalise_item, and the
--                         one before it is the same or alike (role, type, size).
-- Otherwise the nearest wins: the largest position in the conversation (an alteration can
-- hide the parent's response from the hash chain and leave an older one on it), then
-- hash_chain, then a call of the same agent, then the latest.
-- link_kind: continues, or spawns where the parent is another agent's call, or the
-- call is a side call taking over a non-side call's conversation.
-- junction_hash, junction_call_id: where the walk below stopped on an item first stored
-- by another call of the rollout, and that call (a retry shares its whole request).
-- Grain: call_id (unique).
--
-- The walk goes back from the request's last item along parent_hash and stops at the
-- first item that is
--   'head':      the response of an earlier call of the same rollout (the nearest exact
--                continuation), or
--   'junction':  an item first stored by another call of the same rollout (the call shares
--                that call's conversation up to there);
-- and otherwise goes on through items this call stored itself, or that another rollout
-- stored first (GRPO rollouts of one task share their first request), to the chain's
-- first item. Each item is walked by the call that stored it, so the walk is linear in
-- the stored items, and the normalised comparison only looks at the walked items.
CREATE OR REPLACE VIEW stitch_links AS
WITH RECURSIVE
sc AS MATERIALIZED (FROM stitch_calls),
items AS MATERIALIZED (FROM stitch_items),
-- the earliest call of each rollout whose response ends at each hash
heads AS MATERIALIZED (
    SELECT response_head_hash AS hash, rollout_key, min(seq) AS first_seq
    FROM sc
    WHERE response_head_hash IS NOT NULL
    GROUP BY ALL
),
walk(call_id, rollout_key, seq, hash, pos, state, storer_call_id) AS (
    SELECT
        c.call_id,
        c.rollout_key,
        c.seq,
        c.request_head_hash,
        c.last_pos,
        CASE
            WHEN h.first_seq < c.seq THEN 'head'
            WHEN i.storer_call_id <> c.call_id AND i.storer_rollout_key = c.rollout_key
                THEN 'junction'
            ELSE 'walk'
        END,
        i.storer_call_id
    FROM sc AS c
    LEFT JOIN items AS i ON i.hash = c.request_head_hash
    LEFT JOIN heads AS h ON h.hash = c.request_head_hash AND h.rollout_key = c.rollout_key
    WHERE c.request_head_hash IS NOT NULL
    UNION ALL
    SELECT
        w.call_id,
        w.rollout_key,
        w.seq,
        p.hash,
        w.pos - 1,
        CASE
            WHEN h.first_seq < w.seq THEN 'head'
            WHEN p.storer_call_id <> w.call_id AND p.storer_rollout_key = w.rollout_key
                THEN 'junction'
            ELSE 'walk'
        END,
        p.storer_call_id
    FROM walk AS w
    JOIN items AS i ON i.hash = w.hash
    JOIN items AS p ON p.hash = i.parent_hash
    LEFT JOIN heads AS h ON h.hash = p.hash AND h.rollout_key = w.rollout_key
    WHERE w.state = 'walk'
),
walks AS MATERIALIZED (FROM walk),
by_previous_id AS (
    SELECT b.call_id, a.call_id AS parent_call_id, a.seq AS parent_seq,
        'previous_response_id' AS evidence, 1 AS priority, NULL::BIGINT AS pos,
        a.agent_hint = b.agent_hint AS same_agent
    FROM sc AS b
    JOIN sc AS a ON a.response_id = b.previous_response_id AND a.rollout_key = b.rollout_key
    WHERE b.previous_response_id IS NOT NULL AND a.seq < b.seq
),
by_hash AS (
    -- several candidates only where calls of the rollout returned the very same response
    SELECT w.call_id, a.call_id AS parent_call_id, a.seq AS parent_seq,
        'hash_chain' AS evidence, 2 AS priority, w.pos, NULL::BOOLEAN AS same_agent
    FROM (FROM walks WHERE state = 'head') AS w
    JOIN sc AS a ON a.response_head_hash = w.hash AND a.rollout_key = w.rollout_key
    WHERE a.seq < w.seq
),
-- walked items placed in the conversation (all nearer than a hash_chain parent)
placed AS MATERIALIZED (
    SELECT call_id, hash, state, pos, seq, rollout_key
    FROM walks
    WHERE pos IS NOT NULL
        AND state IN ('walk', 'junction')
        AND call_id NOT IN (SELECT call_id FROM by_previous_id)
),
-- earlier calls whose response ended at the position of a walked item
pairs AS MATERIALIZED (
    SELECT t.call_id, t.hash, t.pos, t.state, a.call_id AS parent_call_id, a.seq AS parent_seq,
        a.response_head_hash, r.parent_hash AS response_prev_hash,
        a.agent_hint = b.agent_hint AS same_agent
    FROM placed AS t
    JOIN sc AS a ON a.rollout_key = t.rollout_key AND a.resp_pos = t.pos
    JOIN sc AS b ON b.call_id = t.call_id
    JOIN items AS r ON r.hash = a.response_head_hash
    WHERE a.seq < t.seq
),
-- pairs worth reading the contents of. The tests are computed as a column on joins by key:
-- as join conditions, DuckDB would join on role or type first (a near cross product).
plausible AS MATERIALIZED (
    SELECT q.call_id, q.hash, q.response_head_hash, q.parent_call_id, q.parent_seq, q.pos,
        q.same_agent,
        -- the item has the response's role and type, and the item before it looks like the
        -- one before that call's response: the same, or of the same role and type and about
        -- the size (a junction item is shared with an earlier call, so what precedes it is)
        coalesce(
            si.role IS NOT DISTINCT FROM sr.role
            AND si.item_type IS NOT DISTINCT FROM sr.item_type
            AND (
                q.state = 'junction'
                OR b.hash = q.response_prev_hash
                OR (sb.role IS NOT DISTINCT FROM sp.role
                    AND sb.item_type IS NOT DISTINCT FROM sp.item_type
                    AND abs(sb.content_bytes - sp.content_bytes) <= 1024)
            ),
            false
        ) AS alike
    FROM pairs AS q
    JOIN items AS si ON si.hash = q.hash
    JOIN items AS sr ON sr.hash = q.response_head_hash
    LEFT JOIN placed AS b ON b.call_id = q.call_id AND b.pos = q.pos - 1
    LEFT JOIN items AS sb ON sb.hash = b.hash
    LEFT JOIN items AS sp ON sp.hash = q.response_prev_hash
),
-- (a hash stored twice only repeats a comparison)
contents AS MATERIALIZED (
    SELECT m.hash, m.content_json
    FROM (SELECT hash FROM plausible WHERE alike UNION SELECT response_head_hash FROM plausible WHERE alike) AS n
    JOIN messages AS m ON m.hash = n.hash
    WHERE m.kind = 'item'
),
-- the same item re-chained (Claude Code: its parent changed), else altered; computed as a
-- column so that the regular expressions run once, after the cheap test
compared AS MATERIALIZED (
    SELECT q.call_id, q.parent_call_id, q.parent_seq, q.pos, q.same_agent,
        CASE
            WHEN ci.content_json = cr.content_json THEN true
            ELSE forge_normalise_item(ci.content_json) = forge_normalise_item(cr.content_json)
        END AS same_item
    FROM (FROM plausible WHERE alike) AS q
    JOIN contents AS ci ON ci.hash = q.hash
    JOIN contents AS cr ON cr.hash = q.response_head_hash
),
by_normalised AS (
    SELECT call_id, parent_call_id, parent_seq, 'normalised_chain' AS evidence, 3 AS priority,
        pos, same_agent
    FROM compared
    WHERE same_item
),
best AS (
    SELECT
        call_id,
        arg_max(
            {'parent_call_id': parent_call_id, 'evidence': evidence},
            {'named': priority = 1, 'pos': coalesce(pos, -1), 'exact': -priority,
                'same_agent': coalesce(same_agent, false), 'seq': parent_seq}
        ) AS link
    FROM (
        SELECT * FROM by_previous_id
        UNION ALL SELECT * FROM by_hash
        UNION ALL SELECT * FROM by_normalised
    )
    GROUP BY call_id
),
junctions AS (
    SELECT call_id, hash AS junction_hash, storer_call_id AS junction_call_id
    FROM walks
    WHERE state = 'junction'
)
SELECT
    c.*,
    b.link.parent_call_id,
    b.link.evidence,
    -- a conversation taken over by another agent, or by a side call, is a spawn
    CASE
        WHEN p.agent_hint <> c.agent_hint OR (c.is_side_call AND NOT p.is_side_call)
            THEN 'spawns'
        WHEN p.call_id IS NOT NULL THEN 'continues'
    END AS link_kind,
    j.junction_hash,
    j.junction_call_id
FROM sc AS c
LEFT JOIN best AS b USING (call_id)
LEFT JOIN sc AS p ON p.call_id = b.link.parent_call_id
LEFT JOIN junctions AS j USING (call_id)
