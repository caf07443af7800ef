-- A trajectory does not end before it starts. Returns the ones that do.
SELECT rollout_id, started_at, ended_at, wall_ms
FROM trajectories
WHERE wall_ms < 0
