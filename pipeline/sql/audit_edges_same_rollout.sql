-- Edges whose parent or child is not a call of the edge's rollout (edges never cross
-- rollouts; both ends must be recorded calls). Grain: child_call_id.
SELECT e.child_call_id, e.parent_call_id, e.rollout_id, p.rollout_id AS parent_rollout_id,
    c.rollout_id AS child_rollout_id
FROM edges AS e
LEFT JOIN calls AS p ON p.call_id = e.parent_call_id
LEFT JOIN calls AS c ON c.call_id = e.child_call_id
WHERE p.call_id IS NULL
    OR c.call_id IS NULL
    OR p.rollout_id IS DISTINCT FROM c.rollout_id
    OR e.rollout_id IS DISTINCT FROM c.rollout_id
