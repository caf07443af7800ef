-- Rewards are finite numbers (NaN or infinity would poison a group's mean). Returns
-- trajectories whose latest reward is not.
SELECT rollout_id, reward
FROM trajectories
WHERE reward IS NOT NULL AND NOT isfinite(reward)
