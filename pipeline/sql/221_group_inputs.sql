-- group_inputs: what GRPO grouping reads from each rollout: its task, the policy version
-- that places it in a window (the oldest version that served it), its status, its
-- terminal reward and the verifier's details (for partial credit).
-- Grain: rollout_id (unique; rollouts without a task are kept and counted, not grouped).
CREATE OR REPLACE VIEW group_inputs AS
SELECT
    t.rollout_id,
    t.task_id,
    t.policy_version_min AS policy_version,
    t.status,
    t.reward,
    w.details_json
FROM trajectories AS t
LEFT JOIN rewards_latest AS w USING (rollout_id)
