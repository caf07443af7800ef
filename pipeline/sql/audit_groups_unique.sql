-- A rollout belongs to at most one group. Returns rollouts listed more than once.
SELECT rollout_id, count(*) AS rows
FROM groups
GROUP BY rollout_id
HAVING count(*) > 1
