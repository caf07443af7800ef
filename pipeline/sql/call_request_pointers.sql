-- Where a call's request lives in the content-addressed store: its parameters row,
-- the last item of its chain, and how many items the request itself carried.
-- Grain: one call. Parameter: $call_id.
SELECT request_params_hash, request_head_hash, request_list_key, request_items, request_items_form
FROM calls
WHERE call_id = $call_id
