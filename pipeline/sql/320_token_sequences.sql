-- token_sequences: training sequences built from token_calls, before any grouping:
-- input_ids = the first call's full prompt (prefix + prompt_ids) + its completion, then
-- each later call's prompt delta + completion, in chain order; loss_mask is 1 on the
-- model's own completion tokens and 0 elsewhere; old_logprobs are the sampling logprobs
-- on completion tokens and 0 elsewhere (NULL when a call lacks logprobs, or their count
-- differs from its completion's). Every call with token ids whose chain resolves is in
-- exactly one sequence, so each completion is trained exactly once.
-- Grain: sample_id (unique; the id of the sequence's first call).
CREATE OR REPLACE VIEW token_sequences AS
WITH parts AS (
    SELECT
        t.sample_id,
        t.rollout_id,
        t.call_id,
        t.position,
        c.policy_version,
        CASE
            WHEN t.position = 0 THEN list_concat(coalesce(p.prefix_ids, []), c.prompt_ids)
            ELSE c.prompt_ids
        END AS prompt_part,
        c.completion_ids,
        c.completion_logprobs,
        c.request_images,
        c.completion_logprobs IS NOT NULL
        AND len(c.completion_logprobs) = len(c.completion_ids) AS has_logprobs
    FROM token_calls AS t
    JOIN calls AS c USING (call_id)
    LEFT JOIN token_prefixes AS p ON p.sample_id = t.sample_id AND t.position = 0
    WHERE t.sample_id IS NOT NULL
)
SELECT
    sample_id::VARCHAR AS sample_id,
    any_value(rollout_id)::VARCHAR AS rollout_id,
    list(call_id ORDER BY position)::VARCHAR[] AS call_ids,
    flatten(
        list(list_concat(prompt_part, completion_ids) ORDER BY position)
    )::INTEGER[] AS input_ids,
    flatten(
        list(
            list_concat(
                list_resize([]::TINYINT[], len(prompt_part), 0::TINYINT),
                list_resize([]::TINYINT[], len(completion_ids), 1::TINYINT)
            )
            ORDER BY position
        )
    )::TINYINT[] AS loss_mask,
    CASE
        WHEN bool_and(has_logprobs) THEN flatten(
            list(
                list_concat(
                    list_resize([]::FLOAT[], len(prompt_part), 0.0::FLOAT),
                    completion_logprobs
                )
                ORDER BY position
            )
        )
    END::FLOAT[] AS old_logprobs,
    -- Oldest and newest policy versions that sampled the sequence's completions.
    min(policy_version)::BIGINT AS policy_version,
    max(policy_version)::BIGINT AS policy_version_max,
    sum(len(prompt_part) + len(completion_ids))::BIGINT AS n_tokens,
    sum(len(completion_ids))::BIGINT AS n_loss_tokens,
    count(*)::BIGINT AS n_calls,
    -- The images a vision policy saw, in token order: those the last call sent, without
    -- images given by URL.
    list_filter(
        coalesce(arg_max_null(request_images, position), []),
        lambda x: starts_with(x, 'i1:')
    )::VARCHAR[] AS images
FROM parts
GROUP BY sample_id
