-- Edges whose parent started after its child (edges follow stitch_calls.seq, the order of
-- started_at then call_id, which is what keeps the trees free of cycles). Grain: child_call_id.
SELECT e.child_call_id, e.parent_call_id, p.started_at AS parent_started_at,
    c.started_at AS child_started_at
FROM edges AS e
JOIN calls AS p ON p.call_id = e.parent_call_id
JOIN calls AS c ON c.call_id = e.child_call_id
WHERE p.started_at > c.started_at
    OR (p.started_at IS NOT DISTINCT FROM c.started_at AND p.call_id >= c.call_id)
    OR (p.started_at IS NOT NULL AND c.started_at IS NULL)
