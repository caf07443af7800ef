-- Every trajectory's status is one Forge knows. Returns trajectories with another one
-- (a runner or verifier wrote a status outside the list).
SELECT rollout_id, status
FROM trajectories
WHERE status IS NULL
    OR status NOT IN ('complete', 'partial', 'timed_out', 'crashed', 'infra_error')
