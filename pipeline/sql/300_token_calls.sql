-- token_calls: every call that carries token ids (serve mode), placed in the training
-- sequence it is merged into. A call starts a sequence (position 0) unless it is CLEAN
-- and the first CLEAN call, in its parent's rollout, to extend its parent's prompt +
-- completion: then it continues its parent's sequence at the parent's position + 1. So
-- a chain of CLEAN calls is one sequence, forks (REALIGN, FORK, a second CLEAN child of
-- one parent) start new ones, and every call is in exactly one sequence.
-- Grain: call_id (unique).
--
-- prompt_ids hold the whole prompt unless the call is CLEAN and names a parent
-- (prompt_parent_call_id): then only the delta after the parent's prompt + completion.
-- A CLEAN call is resolved when its parent carries token ids, started strictly before
-- it (by started_at, then call_id: this keeps chains acyclic) and is itself resolved;
-- unresolved calls keep sample_id NULL with the reason (audit_samples_unresolved).
CREATE OR REPLACE VIEW token_calls AS
WITH RECURSIVE
tok AS MATERIALIZED (
    SELECT
        call_id,
        rollout_id,
        started_at,
        drift,
        prompt_parent_call_id,
        drift = 'CLEAN' AND prompt_parent_call_id IS NOT NULL AS is_delta
    FROM calls
    WHERE prompt_ids IS NOT NULL AND completion_ids IS NOT NULL
),
-- CLEAN calls whose parent carries token ids and started before them.
links AS MATERIALIZED (
    SELECT
        c.call_id,
        p.call_id AS parent_id,
        -- The first same-rollout CLEAN child extends the parent's sequence.
        c.rollout_id IS NOT DISTINCT FROM p.rollout_id
        AND row_number() OVER (
            PARTITION BY p.call_id, c.rollout_id IS NOT DISTINCT FROM p.rollout_id
            ORDER BY c.started_at, c.call_id
        ) = 1 AS continues
    FROM tok AS c
    JOIN tok AS p ON p.call_id = c.prompt_parent_call_id
    WHERE c.is_delta
        AND (
            p.started_at < c.started_at
            OR (p.started_at = c.started_at AND p.call_id < c.call_id)
        )
),
-- From every full-prompt call down its CLEAN descendants.
walk(call_id, sample_id, position) AS (
    SELECT call_id, call_id, 0 FROM tok WHERE NOT is_delta
    UNION ALL
    SELECT
        l.call_id,
        CASE WHEN l.continues THEN w.sample_id ELSE l.call_id END,
        CASE WHEN l.continues THEN w.position + 1 ELSE 0 END
    FROM walk AS w
    JOIN links AS l ON l.parent_id = w.call_id
)
SELECT
    t.call_id::VARCHAR AS call_id,
    t.rollout_id::VARCHAR AS rollout_id,
    t.drift::VARCHAR AS drift,
    t.prompt_parent_call_id::VARCHAR AS prompt_parent_call_id,
    -- prompt_ids is a delta after the parent's prompt + completion.
    t.is_delta::BOOLEAN AS is_delta,
    -- The sequence the call is merged into: the id of its first call (NULL: unresolved).
    w.sample_id::VARCHAR AS sample_id,
    -- 0 for the call that starts the sequence, then 1, 2, ... along the CLEAN chain.
    w.position::BIGINT AS position,
    -- Starts a sequence but its prompt is a delta: the parents' tokens come first.
    (w.position = 0 AND t.is_delta)::BOOLEAN AS needs_prefix,
    (
        CASE
            WHEN w.call_id IS NOT NULL THEN NULL
            WHEN p.call_id IS NULL AND NOT EXISTS (
                SELECT 1 FROM calls AS x WHERE x.call_id = t.prompt_parent_call_id
            ) THEN 'parent missing'
            WHEN p.call_id IS NULL THEN 'parent has no token ids'
            WHEN NOT (
                p.started_at < t.started_at
                OR (p.started_at = t.started_at AND p.call_id < t.call_id)
            ) THEN 'parent not earlier'
            ELSE 'parent unresolved'
        END
    )::VARCHAR AS unresolved_reason
FROM tok AS t
LEFT JOIN walk AS w USING (call_id)
LEFT JOIN tok AS p ON p.call_id = t.prompt_parent_call_id
