-- behaviour: how an agent worked in each rollout, for studying harnesses and policies.
-- Grain: rollout_id (unique; every rollout with calls).
--
-- tool_coverage     distinct tools the responses called that the requests offered,
--                   over the distinct tools offered (calls.tools, calls.tool_calls).
-- self_verified     a check (forge_tool_action: test, lint, build, cat, diff, a Read
--                   tool, ...) came after the last edit that did not fail; NULL
--                   without edits.
-- plan_completion   completed steps over all steps in the last plan update (Claude
--                   Code TodoWrite todos, Codex update_plan plan); NULL without a plan.
-- error_recovery    failed tool results followed by a successful call that differs
--                   from the failed one (another tool or other arguments), over the
--                   failed results; NULL without failures.
-- n_gui_actions     GUI actions the responses took (calls.actions: computer-use calls
--                   and browser tools, pipeline/actions.py), with the count of each of
--                   click, type, scroll and navigate; 0 for an agent without any.
CREATE OR REPLACE VIEW behaviour AS
WITH
rollout_tools AS (
    SELECT
        rollout_id,
        list_sort(list_distinct(flatten(list(tools)))) AS offered,
        list_sort(list_distinct(flatten(list(tool_calls)))) AS used
    FROM calls
    WHERE rollout_id IS NOT NULL
    GROUP BY rollout_id
),
ev AS MATERIALIZED (FROM tool_events),
paired AS MATERIALIZED (
    SELECT
        c.rollout_id, c.seq, c.tool_call_id, c.tool_name, c.arguments, c.action,
        r.seq AS result_seq, r.failed
    FROM ev AS c
    LEFT JOIN ev AS r
        ON r.kind = 'result' AND r.rollout_id = c.rollout_id AND r.tool_call_id = c.tool_call_id
    WHERE c.kind = 'call'
),
counts AS (
    SELECT
        rollout_id,
        count(*) AS n_tool_calls,
        count(*) FILTER (WHERE action = 'edit' AND NOT coalesce(failed, false)) AS n_edits,
        count(*) FILTER (WHERE action = 'check') AS n_checks,
        max(seq) FILTER (WHERE action = 'edit' AND NOT coalesce(failed, false)) AS last_edit_seq,
        max(seq) FILTER (WHERE action = 'check') AS last_check_seq,
        count(*) FILTER (WHERE failed) AS n_failed,
        arg_max(arguments, seq) FILTER (WHERE action = 'plan') AS last_plan
    FROM paired
    GROUP BY rollout_id
),
plans AS (
    SELECT
        rollout_id,
        coalesce(
            json_extract_string(last_plan, '$.todos[*].status'),
            json_extract_string(last_plan, '$.plan[*].status')
        ) AS statuses
    FROM counts
    WHERE json_valid(last_plan)
),
recoveries AS (
    SELECT
        f.rollout_id,
        f.tool_call_id,
        EXISTS (
            SELECT 1
            FROM paired AS y
            WHERE y.rollout_id = f.rollout_id
                AND y.seq > f.result_seq
                AND y.result_seq IS NOT NULL
                AND NOT y.failed
                AND (
                    y.tool_name IS DISTINCT FROM f.tool_name
                    OR y.arguments IS DISTINCT FROM f.arguments
                )
        ) AS recovered
    FROM paired AS f
    WHERE f.failed
),
recovery AS (
    SELECT rollout_id, count(*) FILTER (WHERE recovered) AS n_recovered
    FROM recoveries
    GROUP BY rollout_id
),
gui AS (
    SELECT
        rollout_id,
        count(*) AS n_gui_actions,
        count(*) FILTER (WHERE action = 'click') AS n_clicks,
        count(*) FILTER (WHERE action = 'type') AS n_typed,
        count(*) FILTER (WHERE action = 'scroll') AS n_scrolls,
        count(*) FILTER (WHERE action = 'navigate') AS n_navigations
    FROM (SELECT rollout_id, unnest(actions) AS action FROM calls WHERE rollout_id IS NOT NULL)
    GROUP BY rollout_id
)
SELECT
    t.rollout_id::VARCHAR AS rollout_id,
    len(t.offered)::BIGINT AS n_tools_offered,
    len(list_intersect(t.used, t.offered))::BIGINT AS n_tools_used,
    (
        CASE WHEN len(t.offered) > 0
            THEN len(list_intersect(t.used, t.offered)) / len(t.offered)
        END
    )::DOUBLE AS tool_coverage,
    -- Offered tools never called.
    list_filter(t.offered, lambda x: NOT list_contains(t.used, x))::VARCHAR[] AS unused_tools,
    coalesce(c.n_tool_calls, 0)::BIGINT AS n_tool_calls,
    coalesce(c.n_edits, 0)::BIGINT AS n_edits,
    coalesce(c.n_checks, 0)::BIGINT AS n_checks,
    (
        CASE WHEN c.last_edit_seq IS NOT NULL
            THEN coalesce(c.last_check_seq > c.last_edit_seq, false)
        END
    )::BOOLEAN AS self_verified,
    len(p.statuses)::BIGINT AS plan_steps,
    len(list_filter(p.statuses, lambda s: s = 'completed'))::BIGINT AS plan_steps_completed,
    (
        CASE WHEN len(p.statuses) > 0
            THEN len(list_filter(p.statuses, lambda s: s = 'completed')) / len(p.statuses)
        END
    )::DOUBLE AS plan_completion,
    coalesce(c.n_failed, 0)::BIGINT AS n_failed_results,
    coalesce(r.n_recovered, 0)::BIGINT AS n_recovered,
    (CASE WHEN c.n_failed > 0 THEN coalesce(r.n_recovered, 0) / c.n_failed END)::DOUBLE
        AS error_recovery,
    coalesce(g.n_gui_actions, 0)::BIGINT AS n_gui_actions,
    coalesce(g.n_clicks, 0)::BIGINT AS n_clicks,
    coalesce(g.n_typed, 0)::BIGINT AS n_typed,
    coalesce(g.n_scrolls, 0)::BIGINT AS n_scrolls,
    coalesce(g.n_navigations, 0)::BIGINT AS n_navigations
FROM rollout_tools AS t
LEFT JOIN counts AS c USING (rollout_id)
LEFT JOIN plans AS p USING (rollout_id)
LEFT JOIN recovery AS r USING (rollout_id)
LEFT JOIN gui AS g USING (rollout_id)
