-- Calls of one proxy run by api and model: what `forge record` prints when it ends.
-- Grain: (api, model). Parameter: $run_id.
SELECT
    api,
    coalesce(model, '?') AS model,
    count(*)::BIGINT AS calls,
    count(*) FILTER (WHERE status <> 'complete')::BIGINT AS failed,
    coalesce(sum(input_tokens), 0)::BIGINT AS input_tokens,
    coalesce(sum(output_tokens), 0)::BIGINT AS output_tokens,
    bool_or(coalesce(usage_estimated, false)) AS estimated
FROM calls
WHERE run_id = $run_id
GROUP BY ALL
ORDER BY calls DESC, api, model
