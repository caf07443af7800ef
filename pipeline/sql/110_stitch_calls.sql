-- stitch_calls: every call with the facts stitching compares: its order in the rollout,
-- which agent it belongs to by harness headers or process, whether it is a side call,
-- and where its request and response sit in the conversation.
-- Grain: call_id (unique; audit_calls_duplicate_ids checks it).
--
-- rollout_key   rollout_id, or '' for calls recorded without one (they stitch together).
-- seq           1, 2, ... by started_at then call_id (over all calls): an edge always
--               points from a lower seq to a higher one, so the tree has no cycles.
-- agent_hint    the agent by the strongest id the call carries: Claude Code session and
--               agent id, Codex thread, opencode or OpenClaw session, else the process.
-- hint_source   header, process or none: where agent_hint came from.
-- parent_hint   the agent_hint of the agent that started this one, from headers
--               (x-claude-code-agent-id without a parent id means the main agent).
-- agent_label   the agent's own id, used as call_nodes.agent_key for sub-agents.
-- is_side_call  offers no tools and names a model other than the rollout's main model
--               (the model most used by calls that offer tools): titles, summaries.
-- spawn_call    its response asked for a tool of forge_spawn_tools().
-- last_pos      0-based position of the request's last item in the conversation, and
-- resp_pos      of the response's last item; NULL where the request names a
--               previous_response_id (it carries only the new items).
CREATE OR REPLACE VIEW stitch_calls AS
WITH
-- numbered in one narrow sort (a window over the wide rows below costs ten times more)
seqs AS (
    SELECT call_id, row_number() OVER (ORDER BY started_at NULLS FIRST, call_id) AS seq
    FROM calls
),
base AS (
    SELECT
        call_id, rollout_id, coalesce(rollout_id, '') AS rollout_key, started_at, ended_at,
        model, tools, tool_calls, prewarm, pid, parent_pids, claude_session_id,
        claude_agent_id, claude_parent_agent_id, codex_session_id, codex_thread_id,
        codex_parent_thread_id, openai_subagent, opencode_session_id,
        opencode_parent_session_id, openclaw_session_id, request_head_hash,
        response_head_hash, request_items, response_items, previous_response_id, response_id
    FROM calls
),
model_use AS (
    SELECT
        rollout_key,
        model,
        count(*) FILTER (WHERE len(coalesce(tools, [])) > 0) AS n_with_tools,
        count(*) AS n
    FROM base
    WHERE model IS NOT NULL
    GROUP BY ALL
),
main_model AS (
    SELECT rollout_key, model AS main_model
    FROM model_use
    QUALIFY row_number() OVER (
        PARTITION BY rollout_key ORDER BY n_with_tools DESC, n DESC, model
    ) = 1
)
SELECT
    b.call_id,
    b.rollout_id,
    b.rollout_key,
    q.seq,
    b.started_at,
    b.ended_at,
    b.model,
    b.pid,
    b.parent_pids,
    CASE
        WHEN b.claude_session_id IS NOT NULL OR b.claude_agent_id IS NOT NULL
            THEN 'claude:' || coalesce(b.claude_session_id, '') || '/'
                || coalesce(b.claude_agent_id, 'main')
        WHEN b.codex_thread_id IS NOT NULL OR b.codex_session_id IS NOT NULL
            THEN 'codex:' || coalesce(b.codex_thread_id, b.codex_session_id)
        WHEN b.opencode_session_id IS NOT NULL THEN 'opencode:' || b.opencode_session_id
        WHEN b.openclaw_session_id IS NOT NULL THEN 'openclaw:' || b.openclaw_session_id
        WHEN b.pid IS NOT NULL THEN 'pid:' || b.pid
        ELSE 'rollout'
    END AS agent_hint,
    CASE
        WHEN b.claude_session_id IS NOT NULL OR b.claude_agent_id IS NOT NULL
            OR b.codex_thread_id IS NOT NULL OR b.codex_session_id IS NOT NULL
            OR b.opencode_session_id IS NOT NULL OR b.openclaw_session_id IS NOT NULL
            THEN 'header'
        WHEN b.pid IS NOT NULL THEN 'process'
        ELSE 'none'
    END AS hint_source,
    CASE
        WHEN b.claude_agent_id IS NOT NULL
            THEN 'claude:' || coalesce(b.claude_session_id, '') || '/'
                || coalesce(b.claude_parent_agent_id, 'main')
        WHEN b.codex_parent_thread_id IS NOT NULL THEN 'codex:' || b.codex_parent_thread_id
        -- a Codex sub-agent without the parent header: the root thread is the session
        WHEN b.openai_subagent IS NOT NULL AND b.codex_session_id IS NOT NULL
            AND b.codex_session_id IS DISTINCT FROM b.codex_thread_id
            THEN 'codex:' || b.codex_session_id
        WHEN b.opencode_parent_session_id IS NOT NULL
            THEN 'opencode:' || b.opencode_parent_session_id
    END AS parent_hint,
    coalesce(
        b.claude_agent_id,
        'claude:' || b.claude_session_id,
        b.codex_thread_id,
        b.codex_session_id,
        b.opencode_session_id,
        b.openclaw_session_id,
        'pid:' || b.pid
    ) AS agent_label,
    len(coalesce(b.tools, [])) AS n_tools,
    len(coalesce(b.tool_calls, [])) AS n_tool_calls,
    list_has_any(coalesce(b.tool_calls, []), forge_spawn_tools()) AS spawn_call,
    coalesce(
        len(coalesce(b.tools, [])) = 0 AND b.model <> m.main_model, false
    ) AS is_side_call,
    coalesce(b.prewarm, false) AS is_prewarm,
    b.request_head_hash,
    b.response_head_hash,
    b.previous_response_id,
    b.response_id,
    CASE WHEN b.previous_response_id IS NULL THEN b.request_items - 1 END AS last_pos,
    CASE
        WHEN b.previous_response_id IS NULL AND b.response_items > 0
            THEN b.request_items + b.response_items - 1
    END AS resp_pos
FROM base AS b
JOIN seqs AS q USING (call_id)
LEFT JOIN main_model AS m USING (rollout_key)
