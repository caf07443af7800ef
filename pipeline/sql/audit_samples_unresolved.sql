-- Calls with token ids whose chain does not resolve (a CLEAN prompt delta whose parent
-- is missing, has no token ids, did not start earlier, or is itself unresolved): their
-- completions cannot be trained. Must return no rows.
SELECT call_id, rollout_id, prompt_parent_call_id, unresolved_reason
FROM token_calls
WHERE sample_id IS NULL
