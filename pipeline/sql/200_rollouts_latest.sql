-- rollouts_latest: the current row of every rollout (a rollout's row may be rewritten,
-- e.g. "running" then "complete"; the latest written_at wins, ties broken by ended_at).
-- Grain: rollout_id (unique). Columns: those of `rollouts` (pipeline.schema.ROLLOUTS).
CREATE OR REPLACE VIEW rollouts_latest AS
SELECT *
FROM rollouts
QUALIFY row_number() OVER (
    PARTITION BY rollout_id
    ORDER BY written_at DESC NULLS LAST, ended_at DESC NULLS LAST, status
) = 1
