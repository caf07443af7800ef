-- Call ids recorded more than once (stitching and every per-call view assume one row per
-- call). Grain: call_id.
SELECT call_id, count(*) AS rows
FROM calls
GROUP BY call_id
HAVING count(*) > 1
