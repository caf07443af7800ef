-- grpo_groups(...): GRPO groups and the advantage of every rollout under the given
-- settings (arguments as grpo_settings; unset ones come from forge_grpo_* variables or
-- the defaults). The `groups` view is this macro with no arguments.
-- Grain: rollout_id (unique); one row per rollout of group_inputs that has a task.
--
-- Group key: task_id within a policy-version window (group_id = task@v<lo>[-<hi>], or
-- task@unversioned for rollouts recorded without a policy version).
-- Per rollout, in order:
--   1. infra_error rollouts are dropped (the environment failed, not the policy);
--      partial, timed_out and crashed ones follow the `partial` setting; complete ones
--      without a finite reward are dropped as no_reward.
--   2. The rest are the group's members: group_size, group_mean, group_std over them.
--   3. A group of one member follows `single_member`; a group whose members share one
--      reward (group_spread = 0) follows `zero_spread`.
--   4. advantage = (reward - group_mean) / (group_std + eps), or reward - group_mean
--      without std normalisation; gamma = 1, so the trainer gives this terminal
--      advantage to every trained token of the rollout.
CREATE OR REPLACE MACRO grpo_groups(
    normalize_std := NULL,
    unbiased_std := NULL,
    eps := NULL,
    zero_spread := NULL,
    single_member := NULL,
    partial := NULL,
    partial_credit_key := NULL,
    version_window := NULL
) AS TABLE
-- Settings as cfg_* columns: inside a macro a parameter shadows any unqualified column
-- of the same name, so the settings row is read qualified and renamed.
WITH s AS (
    SELECT
        g.normalize_std AS cfg_normalize_std,
        g.unbiased_std AS cfg_unbiased_std,
        g.eps AS cfg_eps,
        g.zero_spread AS cfg_zero_spread,
        g.single_member AS cfg_single_member,
        g.partial AS cfg_partial,
        g.partial_credit_key AS cfg_partial_credit_key,
        g.version_window AS cfg_version_window
    FROM grpo_settings(
        normalize_std := normalize_std,
        unbiased_std := unbiased_std,
        eps := eps,
        zero_spread := zero_spread,
        single_member := single_member,
        partial := partial,
        partial_credit_key := partial_credit_key,
        version_window := version_window
    ) AS g
),
credited AS (
    SELECT
        i.rollout_id,
        i.task_id,
        i.policy_version,
        coalesce(i.status, 'complete') AS status,
        CASE WHEN isfinite(i.reward) THEN i.reward END AS reward,
        -- The verifier's partial credit, when details_json is valid and holds a number.
        CASE
            WHEN json_valid(i.details_json)
                THEN CASE
                    WHEN json_type(i.details_json, '$."' || s.cfg_partial_credit_key || '"')
                        IN ('DOUBLE', 'BIGINT', 'UBIGINT')
                        THEN json_extract(
                            i.details_json, '$."' || s.cfg_partial_credit_key || '"'
                        )::DOUBLE
                END
        END AS credit,
        floor(i.policy_version / s.cfg_version_window)::BIGINT * s.cfg_version_window
            AS window_lo,
        s.*
    FROM group_inputs AS i, s
    WHERE i.task_id IS NOT NULL
),
inputs AS (
    SELECT
        *,
        CASE
            WHEN status = 'infra_error' THEN NULL
            WHEN status <> 'complete' THEN CASE cfg_partial
                WHEN 'zero' THEN 0.0
                WHEN 'credit' THEN CASE WHEN isfinite(credit) THEN credit END
            END
            ELSE reward
        END AS used_reward,
        task_id || '@' || CASE
            WHEN window_lo IS NULL THEN 'unversioned'
            WHEN cfg_version_window = 1 THEN 'v' || window_lo
            ELSE 'v' || window_lo || '-' || (window_lo + cfg_version_window - 1)
        END AS group_id
    FROM credited
),
labelled AS (
    SELECT
        *,
        CASE
            WHEN status = 'infra_error' THEN 'infra_error'
            WHEN status <> 'complete' AND used_reward IS NULL THEN 'partial'
            WHEN used_reward IS NULL THEN 'no_reward'
        END AS input_drop
    FROM inputs
),
stats AS (
    SELECT
        group_id,
        count(*) AS group_size,
        avg(used_reward) AS group_mean,
        CASE
            WHEN any_value(cfg_unbiased_std) THEN stddev_samp(used_reward)
            ELSE stddev_pop(used_reward)
        END AS group_std,
        max(used_reward) - min(used_reward) AS group_spread
    FROM labelled
    WHERE input_drop IS NULL
    GROUP BY group_id
),
decided AS (
    SELECT
        l.*,
        coalesce(g.group_size, 0) AS group_size,
        g.group_mean,
        g.group_std,
        g.group_spread,
        coalesce(
            l.input_drop,
            CASE
                WHEN g.group_size = 1 AND l.cfg_single_member = 'drop' THEN 'single_member'
                WHEN g.group_size > 1 AND g.group_spread = 0 AND l.cfg_zero_spread = 'drop'
                    THEN 'zero_spread'
            END
        ) AS drop_reason
    FROM labelled AS l
    LEFT JOIN stats AS g USING (group_id)
)
SELECT
    rollout_id::VARCHAR AS rollout_id,
    group_id::VARCHAR AS group_id,
    task_id::VARCHAR AS task_id,
    policy_version::BIGINT AS policy_version,
    status::VARCHAR AS status,
    -- The reward the advantage used (0 or the partial credit for partial rollouts).
    used_reward::DOUBLE AS reward,
    -- Members of the group: rollouts not dropped in step 1.
    group_size::BIGINT AS group_size,
    group_mean::DOUBLE AS group_mean,
    group_std::DOUBLE AS group_std,
    group_spread::DOUBLE AS group_spread,
    (
        CASE
            WHEN drop_reason IS NOT NULL THEN NULL
            WHEN group_size = 1 THEN CASE cfg_single_member
                WHEN 'zero' THEN 0.0
                WHEN 'raw' THEN CASE
                    WHEN cfg_normalize_std THEN used_reward / (1.0 + cfg_eps)
                    ELSE used_reward
                END
            END
            -- Exactly 0: the mean of equal floats need not equal them bit for bit.
            WHEN group_spread = 0 THEN 0.0
            WHEN cfg_normalize_std THEN (used_reward - group_mean) / (group_std + cfg_eps)
            ELSE used_reward - group_mean
        END
    )::DOUBLE AS advantage,
    (drop_reason IS NULL)::BOOLEAN AS included,
    -- zero_spread, single_member, partial, no_reward, infra_error, or NULL (included).
    drop_reason::VARCHAR AS drop_reason
FROM decided
ORDER BY group_id, rollout_id
