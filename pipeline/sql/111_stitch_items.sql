-- stitch_items: each conversation item once, without its contents (role, type and size
-- only), with the call that first stored it and that call's rollout key
-- (stitch_calls.rollout_key). Grain: hash (unique).
-- Where several writers stored the same item (one run directory written by several
-- proxies), the earliest call id is kept.
CREATE OR REPLACE VIEW stitch_items AS
WITH items AS (
    SELECT
        hash,
        any_value(parent_hash) AS parent_hash,
        min(first_call_id) AS storer_call_id,
        any_value(role) AS role,
        any_value(item_type) AS item_type,
        any_value(content_bytes) AS content_bytes
    FROM messages
    WHERE kind = 'item'
    GROUP BY hash
)
SELECT
    i.hash,
    i.parent_hash,
    i.storer_call_id,
    i.role,
    i.item_type,
    i.content_bytes,
    -- NULL when the storing call is not in `calls` (matches no rollout)
    CASE WHEN c.call_id IS NOT NULL THEN coalesce(c.rollout_id, '') END AS storer_rollout_key
FROM items AS i
LEFT JOIN calls AS c ON c.call_id = i.storer_call_id
