-- rewards_latest: the current reward of every rollout (a verifier may grade twice, or a
-- person may correct a grade with `forge reward`; the latest written_at wins).
-- Grain: rollout_id (unique). Columns: those of `rewards` (pipeline.schema.REWARDS).
CREATE OR REPLACE VIEW rewards_latest AS
SELECT *
FROM rewards
QUALIFY row_number() OVER (
    PARTITION BY rollout_id
    ORDER BY written_at DESC NULLS LAST, source, reward
) = 1
