-- group_stats: counts of each grouping case under the settings in force (as `groups`).
-- Grain: one row; columns as grpo_group_stats.
CREATE OR REPLACE VIEW group_stats AS
FROM grpo_group_stats()
