-- samples: the training sequences (token_sequences) of rollouts that GRPO grouping
-- included, with the rollout's advantage (gamma = 1: one terminal advantage for every
-- trained token of the rollout; forks of one rollout share it). A trainer reads this.
-- Grain: sample_id (unique; the id of the sequence's first call).
CREATE OR REPLACE VIEW samples AS
SELECT
    s.sample_id,
    s.rollout_id,
    -- GRPO group (groups.group_id): the trainer's uid for group-wise statistics.
    g.group_id::VARCHAR AS group_id,
    s.call_ids,
    -- (n_tokens,) token ids: prompt, completion, prompt delta, completion, ...
    s.input_ids,
    -- (n_tokens,) 1 on the model's own completion tokens, else 0.
    s.loss_mask,
    -- (n_tokens,) sampling logprobs where loss_mask = 1, else 0; NULL when unknown.
    s.old_logprobs,
    g.advantage::DOUBLE AS advantage,
    s.policy_version,
    s.policy_version_max,
    s.n_tokens,
    s.n_loss_tokens,
    s.n_calls,
    -- The images a vision policy saw, in the order of their tokens (images rows' hashes).
    s.images
FROM token_sequences AS s
JOIN groups AS g ON g.rollout_id = s.rollout_id
WHERE g.included
