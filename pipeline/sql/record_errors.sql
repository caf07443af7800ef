-- The most frequent errors of one proxy run, for `forge record`'s summary.
-- Grain: (status, error). Parameter: $run_id.
SELECT status, coalesce(left(error, 160), '(no error text)') AS error, count(*)::BIGINT AS calls
FROM calls
WHERE run_id = $run_id AND status <> 'complete'
GROUP BY ALL
ORDER BY calls DESC
LIMIT 3
