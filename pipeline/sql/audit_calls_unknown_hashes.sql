-- Calls whose request or response chain head is missing from `messages` (a lost messages
-- shard): they cannot be stitched by hash. Grain: call_id.
WITH items AS (SELECT DISTINCT hash FROM messages WHERE kind = 'item')
SELECT c.call_id, c.request_head_hash, c.response_head_hash
FROM calls AS c
LEFT JOIN items AS rq ON rq.hash = c.request_head_hash
LEFT JOIN items AS rs ON rs.hash = c.response_head_hash
WHERE (c.request_head_hash IS NOT NULL AND rq.hash IS NULL)
    OR (c.response_head_hash IS NOT NULL AND rs.hash IS NULL)
