-- eval_trials: the rollouts that count as evaluation trials, with what pass@k is
-- grouped by. A trial is a rollout with a task that was graded (has a reward) or ended
-- without completing (partial, timed_out, crashed: a failure unless its reward says
-- otherwise). infra_error rollouts and complete ones not graded yet are not trials.
-- Grain: rollout_id (unique).
CREATE OR REPLACE VIEW eval_trials AS
SELECT
    rollout_id,
    harness,
    model,
    -- The oldest policy version that served the rollout (NULL in record mode).
    policy_version_min AS policy_version,
    task_id,
    status,
    reward
FROM trajectories
WHERE task_id IS NOT NULL
    AND status <> 'infra_error'
    AND (reward IS NOT NULL OR status <> 'complete')
