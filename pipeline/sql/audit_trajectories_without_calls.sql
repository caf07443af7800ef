-- A rollout without any recorded call must have failed before its first call (crashed,
-- timed_out, infra_error). Returns the others: a reward or runner row whose rollout id
-- matches no call (a mistyped id, or a harness whose traffic was not captured).
SELECT rollout_id, status, reward
FROM trajectories
WHERE n_calls = 0 AND status NOT IN ('crashed', 'timed_out', 'infra_error')
