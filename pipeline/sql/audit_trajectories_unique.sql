-- Every rollout has exactly one trajectory. Returns rollout ids seen more than once.
SELECT rollout_id, count(*) AS rows
FROM trajectories
GROUP BY rollout_id
HAVING count(*) > 1
