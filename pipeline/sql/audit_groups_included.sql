-- A rollout is included exactly when it has no drop reason, and then it has a finite
-- advantage; drop reasons are the documented ones. Returns rows that break this.
SELECT rollout_id, group_id, included, drop_reason, advantage
FROM groups
WHERE included IS DISTINCT FROM (drop_reason IS NULL)
    OR (included AND (advantage IS NULL OR NOT isfinite(advantage)))
    OR (NOT included AND advantage IS NOT NULL)
    OR drop_reason NOT IN ('zero_spread', 'single_member', 'partial', 'no_reward', 'infra_error')
