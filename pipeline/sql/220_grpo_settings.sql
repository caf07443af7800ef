-- grpo_settings(...): the GRPO grouping settings in force, resolved and checked.
-- Grain: one row. Each setting is taken from the macro argument, else from the DuckDB
-- variable forge_grpo_<name> (`SET VARIABLE forge_grpo_eps = 1e-4`), else the default
-- below; pipeline.grpo.GroupSettings holds the same defaults (a test keeps them equal).
--
--   normalize_std      true     divide by the group's std: GRPO (Shao et al. 2024,
--                               DeepSeekMath); false is Dr. GRPO (Liu et al. 2025,
--                               "Understanding R1-Zero-Like Training"), which drops it.
--   unbiased_std       true     sample std (n - 1), as torch.std in verl's
--                               compute_grpo_outcome_advantage and TRL's GRPOTrainer.
--   eps                1e-6     added to the std (verl's default epsilon).
--   zero_spread        'drop'   groups whose members all have the same reward carry no
--                               signal: drop (DAPO's dynamic sampling, Yu et al. 2025)
--                               or keep (advantage exactly 0).
--   single_member      'drop'   a group with one member has no baseline: drop, zero
--                               (advantage 0), or raw (verl's rule made explicit: mean
--                               0 and std 1, so advantage = reward / (1 + eps), or
--                               reward without std normalisation).
--   partial            'drop'   rollouts that did not complete (partial, timed_out,
--                               crashed): drop (as DAPO's overlong filtering masks
--                               truncated samples), zero (reward 0: unfinished counts
--                               as failed) or credit (the verifier's partial credit).
--   partial_credit_key 'partial_credit'  top-level key of rewards.details_json that
--                               holds the partial credit (a number; without one the
--                               rollout is dropped).
--   version_window     1        width of the policy-version windows a group spans:
--                               window k holds versions [k * w, k * w + w - 1].
CREATE OR REPLACE MACRO grpo_settings(
    normalize_std := NULL,
    unbiased_std := NULL,
    eps := NULL,
    zero_spread := NULL,
    single_member := NULL,
    partial := NULL,
    partial_credit_key := NULL,
    version_window := NULL
) AS TABLE
-- Inside a macro a parameter shadows any unqualified column of the same name, so the
-- resolved settings are always read qualified (r.eps, not eps).
WITH resolved AS (
    SELECT
        coalesce(normalize_std, getvariable('forge_grpo_normalize_std'), true)::BOOLEAN
            AS normalize_std,
        coalesce(unbiased_std, getvariable('forge_grpo_unbiased_std'), true)::BOOLEAN
            AS unbiased_std,
        coalesce(eps, getvariable('forge_grpo_eps'), 1e-6)::DOUBLE AS eps,
        coalesce(zero_spread, getvariable('forge_grpo_zero_spread'), 'drop')::VARCHAR
            AS zero_spread,
        coalesce(single_member, getvariable('forge_grpo_single_member'), 'drop')::VARCHAR
            AS single_member,
        coalesce(partial, getvariable('forge_grpo_partial'), 'drop')::VARCHAR AS partial,
        coalesce(
            partial_credit_key, getvariable('forge_grpo_partial_credit_key'), 'partial_credit'
        )::VARCHAR AS partial_credit_key,
        coalesce(version_window, getvariable('forge_grpo_version_window'), 1)::BIGINT
            AS version_window
)
SELECT
    r.normalize_std,
    r.unbiased_std,
    CASE
        WHEN r.eps >= 0 AND isfinite(r.eps) THEN r.eps
        ELSE error('grpo setting eps must be a finite number >= 0, got ' || r.eps)
    END AS eps,
    CASE
        WHEN r.zero_spread IN ('drop', 'keep') THEN r.zero_spread
        ELSE error('grpo setting zero_spread must be drop or keep, got ' || r.zero_spread)
    END AS zero_spread,
    CASE
        WHEN r.single_member IN ('drop', 'zero', 'raw') THEN r.single_member
        ELSE error(
            'grpo setting single_member must be drop, zero or raw, got ' || r.single_member
        )
    END AS single_member,
    CASE
        WHEN r.partial IN ('drop', 'zero', 'credit') THEN r.partial
        ELSE error('grpo setting partial must be drop, zero or credit, got ' || r.partial)
    END AS partial,
    CASE
        WHEN r.partial_credit_key <> '' AND NOT regexp_matches(r.partial_credit_key, '["\\]')
            THEN r.partial_credit_key
        ELSE error(
            'grpo setting partial_credit_key must be a non-empty key without " or \, got '
            || r.partial_credit_key
        )
    END AS partial_credit_key,
    CASE
        WHEN r.version_window >= 1 THEN r.version_window
        ELSE error('grpo setting version_window must be >= 1, got ' || r.version_window)
    END AS version_window
FROM resolved AS r
