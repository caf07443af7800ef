-- groups: GRPO groups under the settings in force (forge_grpo_* variables, else the
-- defaults of grpo_settings). pipeline.grpo.compute_groups passes settings explicitly.
-- Grain: rollout_id (unique); columns as grpo_groups.
CREATE OR REPLACE VIEW groups AS
FROM grpo_groups()
