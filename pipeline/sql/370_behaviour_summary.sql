-- behaviour_summary: the behaviour views aggregated per harness and main model (from
-- trajectories), for comparing harnesses and policies. Rates average over the
-- trajectories where they are defined (self-verification over those with edits, plan
-- completion over those with a plan); error_recovery pools the failures of all of them.
-- Grain: (harness, model).
CREATE OR REPLACE VIEW behaviour_summary AS
SELECT
    t.harness::VARCHAR AS harness,
    t.model::VARCHAR AS model,
    count(*)::BIGINT AS n_trajectories,
    avg(t.reward)::DOUBLE AS mean_reward,
    avg(b.tool_coverage)::DOUBLE AS mean_tool_coverage,
    count(*) FILTER (WHERE b.self_verified IS NOT NULL)::BIGINT AS n_with_edits,
    avg(b.self_verified::INTEGER)::DOUBLE AS self_verification_rate,
    count(*) FILTER (WHERE b.plan_completion IS NOT NULL)::BIGINT AS n_with_plan,
    avg(b.plan_completion)::DOUBLE AS mean_plan_completion,
    sum(b.n_failed_results)::BIGINT AS n_failed_results,
    sum(b.n_recovered)::BIGINT AS n_recovered,
    (sum(b.n_recovered) / nullif(sum(b.n_failed_results), 0))::DOUBLE AS error_recovery,
    avg(b.n_gui_actions)::DOUBLE AS mean_gui_actions
FROM behaviour AS b
JOIN trajectories AS t USING (rollout_id)
GROUP BY ALL
ORDER BY harness NULLS FIRST, model NULLS FIRST
