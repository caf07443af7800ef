-- trajectories: one row per rollout (every rollout id seen in `rollouts`, `calls` or
-- `rewards`), with its task, harness, models, policy versions, status, reward, call
-- counts, tree shape (from `call_nodes`), tokens and wall time.
-- Grain: rollout_id (unique).
--
-- status: the worst of the runner's status (rollouts_latest), the verifier's status
-- (rewards_latest), and `partial` when any call of the rollout is `incomplete`, in the
-- order infra_error > crashed > timed_out > partial > complete. A status outside that
-- list is passed through (audit_trajectories_status reports it). With no runner row and
-- no verifier status, a rollout whose calls all completed is `complete`.
CREATE OR REPLACE VIEW trajectories AS
WITH nodes AS MATERIALIZED (
    -- Read once: call_nodes is the whole stitching pipeline.
    SELECT call_id, rollout_id, parent_call_id, depth, agent_key, is_side_call, is_prewarm
    FROM call_nodes
    WHERE rollout_id IS NOT NULL
),
call_stats AS (
    SELECT
        rollout_id,
        count(*) AS n_calls,
        count(*) FILTER (WHERE status = 'incomplete') AS n_incomplete_calls,
        list_sort(list_distinct(list(coalesce(model, response_model)))) AS models,
        min(policy_version) AS policy_version_min,
        max(policy_version) AS policy_version_max,
        -- Anthropic reports cached prompt tokens apart from input_tokens; OpenAI's
        -- input_tokens already include them (cache_read_tokens is a part of it).
        sum(
            input_tokens
            + CASE
                WHEN api = 'anthropic_messages'
                    THEN coalesce(cache_read_tokens, 0) + coalesce(cache_write_tokens, 0)
                ELSE 0
            END
        ) AS tokens_in,
        sum(output_tokens) AS tokens_out,
        min(started_at) AS first_call_at,
        max(ended_at) AS last_call_at
    FROM calls
    WHERE rollout_id IS NOT NULL
    GROUP BY rollout_id
),
-- The main model: the one that served most of the rollout's agent calls (side calls
-- such as titles, and Codex prewarms, excluded); ties go to the first name.
model_counts AS (
    SELECT c.rollout_id, coalesce(c.model, c.response_model) AS model, count(*) AS n
    FROM calls AS c
    JOIN nodes AS n USING (call_id)
    WHERE c.rollout_id IS NOT NULL
        AND coalesce(c.model, c.response_model) IS NOT NULL
        AND NOT coalesce(n.is_side_call, false)
        AND NOT coalesce(n.is_prewarm, false)
    GROUP BY ALL
),
main_model AS (
    SELECT rollout_id, model
    FROM model_counts
    QUALIFY row_number() OVER (PARTITION BY rollout_id ORDER BY n DESC, model) = 1
),
tree AS (
    SELECT
        rollout_id,
        max(depth) AS depth,
        count(DISTINCT agent_key) FILTER (WHERE NOT coalesce(is_side_call, false)) AS n_agents
    FROM nodes
    GROUP BY rollout_id
),
children AS (
    SELECT rollout_id, parent_call_id, count(*) AS n_children
    FROM nodes
    WHERE parent_call_id IS NOT NULL
    GROUP BY ALL
),
fan AS (
    SELECT rollout_id, max(n_children) AS fan_out FROM children GROUP BY rollout_id
),
ids AS (
    SELECT rollout_id FROM rollouts_latest
    UNION
    SELECT rollout_id FROM call_stats
    UNION
    SELECT rollout_id FROM rewards_latest
),
known AS (
    SELECT
        ids.rollout_id,
        r.task_id,
        r.harness,
        r.status AS runner_status,
        w.status AS verifier_status,
        coalesce(cs.n_incomplete_calls, 0) AS n_incomplete_calls,
        r.policy_version AS launch_policy_version,
        r.started_at AS runner_started_at,
        r.ended_at AS runner_ended_at,
        w.reward,
        cs.n_calls,
        cs.models,
        cs.policy_version_min,
        cs.policy_version_max,
        cs.tokens_in,
        cs.tokens_out,
        cs.first_call_at,
        cs.last_call_at,
        t.depth,
        t.n_agents,
        f.fan_out,
        m.model AS main_model
    FROM ids
    LEFT JOIN rollouts_latest AS r USING (rollout_id)
    LEFT JOIN rewards_latest AS w USING (rollout_id)
    LEFT JOIN call_stats AS cs USING (rollout_id)
    LEFT JOIN tree AS t USING (rollout_id)
    LEFT JOIN fan AS f USING (rollout_id)
    LEFT JOIN main_model AS m USING (rollout_id)
)
SELECT
    rollout_id::VARCHAR AS rollout_id,
    task_id::VARCHAR AS task_id,
    harness::VARCHAR AS harness,
    -- Main model (see main_model above); every model the rollout called is in models.
    main_model::VARCHAR AS model,
    coalesce(models, [])::VARCHAR[] AS models,
    -- Versions that served the calls (serve mode); else the version it was launched with.
    coalesce(policy_version_min, launch_policy_version)::BIGINT AS policy_version_min,
    coalesce(policy_version_max, launch_policy_version)::BIGINT AS policy_version_max,
    (
        CASE
            WHEN runner_status IS NOT NULL
                AND runner_status NOT IN (
                    'complete', 'partial', 'timed_out', 'crashed', 'infra_error'
                )
                THEN runner_status
            WHEN verifier_status IS NOT NULL
                AND verifier_status NOT IN (
                    'complete', 'partial', 'timed_out', 'crashed', 'infra_error'
                )
                THEN verifier_status
            WHEN 'infra_error' IN (runner_status, verifier_status) THEN 'infra_error'
            WHEN 'crashed' IN (runner_status, verifier_status) THEN 'crashed'
            WHEN 'timed_out' IN (runner_status, verifier_status) THEN 'timed_out'
            WHEN 'partial' IN (runner_status, verifier_status) OR n_incomplete_calls > 0
                THEN 'partial'
            ELSE 'complete'
        END
    )::VARCHAR AS status,
    -- Terminal reward from rewards_latest (NULL: not graded yet).
    reward::DOUBLE AS reward,
    coalesce(n_calls, 0)::BIGINT AS n_calls,
    n_incomplete_calls::BIGINT AS n_incomplete_calls,
    -- Largest call depth in the rollout's tree (call_nodes.depth); NULL without calls.
    depth::BIGINT AS depth,
    -- Most children of any one call (continuations, spawned agents and side calls).
    coalesce(fan_out, 0)::BIGINT AS fan_out,
    -- Distinct agents (call_nodes.agent_key) among calls that are not side calls.
    coalesce(n_agents, 0)::BIGINT AS n_agents,
    -- Prompt tokens the provider processed, cached ones included (see call_stats).
    coalesce(tokens_in, 0)::BIGINT AS tokens_in,
    coalesce(tokens_out, 0)::BIGINT AS tokens_out,
    -- The runner's start and end when it wrote a row, else the first and last call.
    (
        (epoch_us(coalesce(runner_ended_at, last_call_at))
            - epoch_us(coalesce(runner_started_at, first_call_at))) / 1000.0
    )::DOUBLE AS wall_ms,
    coalesce(runner_started_at, first_call_at) AS started_at,
    coalesce(runner_ended_at, last_call_at) AS ended_at
FROM known
ORDER BY rollout_id
