-- Every call with a rollout id is counted in exactly one trajectory. Returns the totals
-- when they differ.
SELECT t.counted, c.calls
FROM (SELECT coalesce(sum(n_calls), 0) AS counted FROM trajectories) AS t,
    (SELECT count(*) AS calls FROM calls WHERE rollout_id IS NOT NULL) AS c
WHERE t.counted <> c.calls
