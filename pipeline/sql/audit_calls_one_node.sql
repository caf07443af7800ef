-- Calls that are not exactly one call_nodes row with a place in a tree (depth and root),
-- and call_nodes rows that are not calls. Grain: call_id.
WITH counted AS (
    SELECT call_id, count(*) AS nodes, count(depth) AS placed
    FROM call_nodes
    GROUP BY call_id
)
SELECT c.call_id, coalesce(n.nodes, 0) AS nodes, coalesce(n.placed, 0) AS placed
FROM calls AS c
FULL JOIN counted AS n USING (call_id)
WHERE c.call_id IS NULL OR n.nodes IS DISTINCT FROM 1 OR n.placed IS DISTINCT FROM 1
