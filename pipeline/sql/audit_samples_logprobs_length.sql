-- Calls whose completion_logprobs are not one per completion token: their sequence gets
-- no old_logprobs (token_sequences), so a trainer must recompute them. Must return no rows.
SELECT call_id, rollout_id, len(completion_ids) AS completion_tokens,
    len(completion_logprobs) AS logprobs
FROM calls
WHERE completion_ids IS NOT NULL
    AND completion_logprobs IS NOT NULL
    AND len(completion_logprobs) <> len(completion_ids)
