-- edges: parent -> child links between the calls of one rollout, with the kind of link
-- and the evidence used (rules in stitch_edges). Grain: child_call_id (unique: a call has
-- at most one parent; calls without a row are roots). Never across rollouts.
--
-- kind        continues | spawns | compacts.
-- evidence    previous_response_id | hash_chain | normalised_chain | header |
--             process_tree | time.
-- child_is_side_call  the child is a side call (call_nodes.is_side_call).
CREATE OR REPLACE VIEW edges AS
SELECT
    rollout_id,
    parent_call_id,
    call_id AS child_call_id,
    kind,
    evidence,
    is_side_call AS child_is_side_call
FROM stitch_edges
WHERE parent_call_id IS NOT NULL
