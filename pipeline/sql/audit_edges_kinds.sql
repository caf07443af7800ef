-- Edges with a kind or evidence outside the documented values, or a side-call flag that
-- disagrees with call_nodes. Grain: child_call_id.
SELECT e.child_call_id, e.kind, e.evidence, e.child_is_side_call
FROM edges AS e
LEFT JOIN call_nodes AS n ON n.call_id = e.child_call_id
WHERE e.kind IS NULL
    OR e.kind NOT IN ('continues', 'spawns', 'compacts')
    OR e.evidence IS NULL
    OR e.evidence NOT IN (
        'previous_response_id', 'hash_chain', 'normalised_chain', 'header', 'process_tree', 'time'
    )
    OR e.child_is_side_call IS DISTINCT FROM n.is_side_call
