-- Samples (what a trainer reads) whose aligned lists disagree: loss_mask and
-- old_logprobs must be as long as input_ids, n_tokens and n_loss_tokens must count them,
-- the mask must hold only 0 and 1, and old_logprobs must be 0 wherever the mask is 0.
-- Must return no rows.
SELECT sample_id, rollout_id, len(input_ids) AS ids, len(loss_mask) AS mask,
    len(old_logprobs) AS logprobs, n_tokens, n_loss_tokens
FROM samples
WHERE len(loss_mask) <> len(input_ids)
    OR (old_logprobs IS NOT NULL AND len(old_logprobs) <> len(input_ids))
    OR n_tokens <> len(input_ids)
    OR n_loss_tokens <> list_sum(loss_mask)
    OR len(list_filter(loss_mask, lambda m: m NOT IN (0, 1))) > 0
    OR (
        old_logprobs IS NOT NULL
        AND len(list_filter(old_logprobs, lambda x, i: loss_mask[i] = 0 AND x <> 0)) > 0
    )
