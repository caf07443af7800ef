-- eval_pass_rates(ks := [1], threshold := NULL): pass@k and pass^k of every task for
-- each k in ks, per harness, model and policy version. A trial succeeds when its reward
-- >= threshold (argument, else the variable forge_eval_threshold, else 1.0: the reward a
-- binary verifier gives a solved task; set it lower for graded rewards). Rates are NULL
-- where k exceeds the task's number of trials.
-- Grain: (harness, model, policy_version, task_id, k).
CREATE OR REPLACE MACRO eval_pass_rates(ks := [1], threshold := NULL) AS TABLE
WITH s AS (
    SELECT
        coalesce(threshold, getvariable('forge_eval_threshold'), 1.0)::DOUBLE AS threshold,
        CASE
            WHEN len(ks) > 0 AND list_min(ks) >= 1 THEN ks::BIGINT[]
            ELSE error('eval k values must be integers >= 1, got ' || ks::VARCHAR)
        END AS ks
),
tasks AS (
    SELECT
        t.harness,
        t.model,
        t.policy_version,
        t.task_id,
        count(*) AS n_trials,
        count(*) FILTER (WHERE coalesce(t.reward >= s.threshold, false)) AS n_success
    FROM eval_trials AS t, s
    GROUP BY ALL
)
SELECT
    harness::VARCHAR AS harness,
    model::VARCHAR AS model,
    policy_version::BIGINT AS policy_version,
    task_id::VARCHAR AS task_id,
    k::BIGINT AS k,
    n_trials::BIGINT AS n_trials,
    n_success::BIGINT AS n_success,
    pass_at_k(n_trials, n_success, k) AS pass_at_k,
    pass_hat_k(n_trials, n_success, k) AS pass_hat_k
FROM tasks, s, unnest(s.ks) AS u(k)
ORDER BY harness NULLS FIRST, model NULLS FIRST, policy_version NULLS FIRST, task_id, k
