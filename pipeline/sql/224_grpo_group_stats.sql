-- grpo_group_stats(...): how many groups and rollouts fell in each case under the given
-- settings (arguments as grpo_groups), for a trainer's log.
-- Grain: one row.
CREATE OR REPLACE MACRO grpo_group_stats(
    normalize_std := NULL,
    unbiased_std := NULL,
    eps := NULL,
    zero_spread := NULL,
    single_member := NULL,
    partial := NULL,
    partial_credit_key := NULL,
    version_window := NULL
) AS TABLE
WITH g AS (
    FROM grpo_groups(
        normalize_std := normalize_std,
        unbiased_std := unbiased_std,
        eps := eps,
        zero_spread := zero_spread,
        single_member := single_member,
        partial := partial,
        partial_credit_key := partial_credit_key,
        version_window := version_window
    )
)
SELECT
    -- Groups and rollouts that have a task (rollouts without one are not grouped).
    count(DISTINCT group_id)::BIGINT AS n_groups,
    count(*)::BIGINT AS n_rollouts,
    count(DISTINCT group_id) FILTER (WHERE included)::BIGINT AS n_groups_included,
    count(*) FILTER (WHERE included)::BIGINT AS n_rollouts_included,
    -- Groups of 2+ members sharing one reward, whether dropped or kept.
    count(DISTINCT group_id) FILTER (
        WHERE group_size > 1 AND group_spread = 0
    )::BIGINT AS n_groups_zero_spread,
    count(*) FILTER (
        WHERE group_size > 1 AND group_spread = 0
            AND (drop_reason IS NULL OR drop_reason = 'zero_spread')
    )::BIGINT AS n_rollouts_zero_spread,
    -- Groups of exactly one member, whether dropped or kept.
    count(DISTINCT group_id) FILTER (WHERE group_size = 1)::BIGINT AS n_groups_single_member,
    -- Groups whose every rollout was dropped before the statistics (no members).
    count(DISTINCT group_id) FILTER (WHERE group_size = 0)::BIGINT AS n_groups_empty,
    -- Rollouts that did not complete (partial, timed_out, crashed) ...
    count(*) FILTER (WHERE status NOT IN ('complete', 'infra_error'))::BIGINT
        AS n_rollouts_partial,
    -- ... of which dropped (setting drop, or credit without a credit value) ...
    count(*) FILTER (WHERE drop_reason = 'partial')::BIGINT AS n_rollouts_partial_dropped,
    -- ... and of which given a reward (0, or the credit) and made members.
    count(*) FILTER (
        WHERE status NOT IN ('complete', 'infra_error') AND reward IS NOT NULL
    )::BIGINT AS n_rollouts_partial_rewarded,
    count(*) FILTER (WHERE drop_reason = 'no_reward')::BIGINT AS n_rollouts_no_reward,
    count(*) FILTER (WHERE drop_reason = 'infra_error')::BIGINT AS n_rollouts_infra_error,
    (SELECT count(*) FROM group_inputs WHERE task_id IS NULL)::BIGINT AS n_rollouts_no_task
FROM g
