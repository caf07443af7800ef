-- Each completion is trained exactly once: every resolved call with token ids is in
-- exactly one token sequence, and every such call of a rollout that grouping included is
-- in exactly one sample. Returns the calls that break this; must return no rows.
WITH in_sequences AS (
    SELECT unnest(call_ids) AS call_id FROM token_sequences
),
seq_counts AS (
    SELECT call_id, count(*) AS n FROM in_sequences GROUP BY call_id
),
in_samples AS (
    SELECT unnest(call_ids) AS call_id FROM samples
),
sample_counts AS (
    SELECT call_id, count(*) AS n FROM in_samples GROUP BY call_id
)
SELECT
    t.call_id,
    t.rollout_id,
    coalesce(q.n, 0) AS n_sequences,
    coalesce(s.n, 0) AS n_samples,
    coalesce(g.included, false) AS rollout_included
FROM token_calls AS t
LEFT JOIN seq_counts AS q USING (call_id)
LEFT JOIN sample_counts AS s USING (call_id)
LEFT JOIN groups AS g ON g.rollout_id = t.rollout_id
WHERE t.sample_id IS NOT NULL
    AND (
        coalesce(q.n, 0) <> 1
        OR coalesce(s.n, 0) <> CASE WHEN coalesce(g.included, false) THEN 1 ELSE 0 END
    )
