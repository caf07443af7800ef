-- Calls with more than one incoming edge (a call has at most one parent).
-- Grain: child_call_id.
SELECT child_call_id, count(*) AS parents
FROM edges
GROUP BY child_call_id
HAVING count(*) > 1
