-- sft_chains: the last call of every agent chain, whose request and response hold the
-- chain's whole conversation: an SFT example (pipeline.export). A chain is a run of
-- `continues` edges; its last call is a complete call that no complete call of the same
-- rollout continues (a retry's failed sibling does not end it; side calls that read the
-- conversation do not continue it). Sub-agents, and chains that compaction replaced,
-- give their own examples; side calls and Codex prewarms give none.
-- Grain: call_id (unique).
CREATE OR REPLACE VIEW sft_chains AS
WITH continued AS (
    SELECT DISTINCT e.parent_call_id AS call_id
    FROM edges AS e
    JOIN calls AS k ON k.call_id = e.child_call_id
    WHERE e.kind = 'continues'
        AND k.status = 'complete'
        AND NOT coalesce(e.child_is_side_call, false)
)
SELECT
    c.call_id::VARCHAR AS call_id,
    c.rollout_id::VARCHAR AS rollout_id,
    n.agent_key::VARCHAR AS agent_key,
    n.root_call_id::VARCHAR AS root_call_id,
    n.depth::BIGINT AS depth,
    c.api::VARCHAR AS api,
    coalesce(c.response_model, c.model)::VARCHAR AS model,
    c.policy_version::BIGINT AS policy_version,
    t.task_id::VARCHAR AS task_id,
    t.harness::VARCHAR AS harness,
    t.status::VARCHAR AS status,
    t.reward::DOUBLE AS reward,
    c.started_at
FROM calls AS c
JOIN call_nodes AS n USING (call_id)
LEFT JOIN trajectories AS t ON t.rollout_id = c.rollout_id
WHERE c.status = 'complete'
    AND c.response_head_hash IS NOT NULL
    AND c.api IN ('anthropic_messages', 'openai_chat', 'openai_responses')
    AND NOT coalesce(n.is_side_call, false)
    AND NOT coalesce(n.is_prewarm, false)
    AND NOT EXISTS (SELECT 1 FROM continued AS x WHERE x.call_id = c.call_id)
