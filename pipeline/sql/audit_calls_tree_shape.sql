-- call_nodes rows that disagree with their parent: depth is the parent's plus one, the
-- root is the parent's root, a root is its own root at depth 0, and the parent is the
-- one in `edges`. Grain: call_id.
SELECT n.call_id, n.parent_call_id, n.depth, n.root_call_id, p.depth AS parent_depth,
    p.root_call_id AS parent_root_call_id, e.parent_call_id AS edge_parent_call_id
FROM call_nodes AS n
LEFT JOIN call_nodes AS p ON p.call_id = n.parent_call_id
LEFT JOIN edges AS e ON e.child_call_id = n.call_id
WHERE n.parent_call_id IS DISTINCT FROM e.parent_call_id
    OR n.edge_kind IS DISTINCT FROM e.kind
    OR (n.parent_call_id IS NULL AND (n.depth <> 0 OR n.root_call_id <> n.call_id))
    OR (n.parent_call_id IS NOT NULL
        AND (n.depth IS DISTINCT FROM p.depth + 1 OR n.root_call_id IS DISTINCT FROM p.root_call_id))
