-- call_nodes: one row per call with its place in its rollout's call tree.
-- Grain: call_id (unique; every call of `calls`, prewarms and side calls included).
--
-- parent_call_id, edge_kind  its incoming edge (`edges`; NULL for roots).
-- depth          edges from its root (root = 0); root_call_id that root.
-- agent_key      which agent chain it belongs to: 'main' for the rollout's main agent
--                (the agent of its first call that is neither a side call nor a
--                sub-agent by headers), else the sub-agent's own id (Claude Code agent
--                id, Codex thread id, opencode/OpenClaw session, 'pid:<pid>' for another
--                process), 'chain:<call_id>' for a sub-agent of the same process known
--                only by time, 'side:<call_id>' for a side call and what continues it.
--                It is inherited along continues and compacts edges.
-- is_side_call   no tools offered and a model other than the rollout's main model.
-- is_prewarm     a Codex generate:false warm-up: a node, never trained.
CREATE OR REPLACE VIEW call_nodes AS
WITH RECURSIVE
nodes AS MATERIALIZED (FROM stitch_edges),
main_agent AS (
    SELECT rollout_key, arg_min(agent_hint, seq) AS main_hint
    FROM nodes
    WHERE NOT is_side_call AND parent_hint IS NULL
    GROUP BY rollout_key
),
-- narrow rows: the recursion joins them once per level
placed AS MATERIALIZED (
    SELECT n.call_id, n.parent_call_id, n.kind, n.agent_hint, n.agent_label, n.is_side_call,
        m.main_hint
    FROM nodes AS n
    LEFT JOIN main_agent AS m USING (rollout_key)
),
tree(call_id, depth, root_call_id, agent_key, agent_hint) AS (
    SELECT call_id, 0, call_id,
        CASE
            WHEN is_side_call THEN 'side:' || call_id
            WHEN agent_hint = main_hint THEN 'main'
            ELSE agent_label
        END,
        agent_hint
    FROM placed
    WHERE parent_call_id IS NULL
    UNION ALL
    SELECT n.call_id, t.depth + 1, t.root_call_id,
        CASE
            WHEN n.kind <> 'spawns' THEN t.agent_key
            WHEN n.is_side_call THEN 'side:' || n.call_id
            -- a sub-agent its parent's headers or process cannot tell apart
            WHEN n.agent_hint = t.agent_hint THEN 'chain:' || n.call_id
            WHEN n.agent_hint = n.main_hint THEN 'main'
            ELSE coalesce(n.agent_label, 'chain:' || n.call_id)
        END,
        n.agent_hint
    FROM tree AS t
    JOIN placed AS n ON n.parent_call_id = t.call_id
)
SELECT
    n.call_id,
    n.rollout_id,
    n.parent_call_id,
    n.kind AS edge_kind,
    t.depth::BIGINT AS depth,
    t.root_call_id,
    t.agent_key,
    n.is_side_call,
    n.is_prewarm
FROM nodes AS n
LEFT JOIN tree AS t USING (call_id)
