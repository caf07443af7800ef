-- A group's rollouts share one task and one policy-version window. Returns groups whose
-- rollouts do not (their task ids and versions).
SELECT group_id, list(DISTINCT task_id) AS task_ids, list(DISTINCT policy_version) AS versions
FROM groups, grpo_settings() AS s
GROUP BY group_id
HAVING count(DISTINCT task_id) > 1
    OR count(DISTINCT floor(policy_version / s.version_window)) > 1
