-- stitch_edges: every call with its incoming edge (NULL for roots) and what the tree
-- needs of it. Grain: call_id (unique). `edges` and `call_nodes` read it. Edges never
-- cross rollouts and always point from an earlier call to a later one (stitch_calls.seq),
-- so the calls of a rollout form a forest.
--
-- kind 'continues'  the child extends the parent's conversation (stitch_links), same agent;
--      'spawns'     the child starts a sub-agent or a side call from the parent: a
--                   conversation of another agent or a side call that extends the
--                   parent's, or the first call of a new chain attached by harness
--                   headers, the process tree, or time;
--      'compacts'   the child starts a new chain of the same agent that replaces the
--                   history of the chain whose last call is the parent (summarisation).
-- evidence: previous_response_id, hash_chain, normalised_chain (stitch_links), header,
--   process_tree or time (first calls of new chains, below).
--
-- A call with no parent in stitch_links starts a chain. It is a retry when its request is
-- a same-agent call's whole request plus nothing or more (stitch_links.junction_*) and no
-- call continued that one: it gets that call's parent and kind. Any other chain start R
-- takes, in this order:
--   side calls  the latest non-side call of the same agent, else as process_tree below,
--               else the latest non-side call of the rollout (time);
--   compacts    the latest earlier call of R's own agent (unless R offers no tools and
--               that call did: a helper such as a probe), except where the agent is known
--               only by its process and that call's tool call was still pending (no
--               continuation started before R): then R is a sub-agent it spawned (time);
--   header      the harness's parent agent (parent_hint): its latest earlier call that
--               asked for a forge_spawn_tools() tool, else that asked for any tool, else
--               its latest call;
--   process_tree  the nearest ancestor process (parent_pids) with calls in the rollout:
--               its latest earlier call, preferred as for header;
--   time        the latest earlier call (any agent) whose tool call was still pending.
-- A chain start matching none of them is a root (the rollout's first call, or a call
-- nothing explains).
CREATE OR REPLACE VIEW stitch_edges AS
WITH
sc AS MATERIALIZED (FROM stitch_links),
linked AS (
    SELECT call_id AS child_call_id, parent_call_id, link_kind AS kind, evidence, rollout_key, seq
    FROM sc
    WHERE parent_call_id IS NOT NULL
),
-- calls re-sending the whole request of a same-agent call that nothing continued (it
-- failed, or its answer was dropped): siblings of that call. (A compaction that restarts
-- from the first request's items is no retry: the first call was continued.)
retries AS (
    SELECT c.call_id, x.call_id AS of_call_id
    FROM sc AS c
    JOIN sc AS x ON x.call_id = c.junction_call_id
    WHERE c.parent_call_id IS NULL
        AND c.junction_hash = x.request_head_hash
        AND x.agent_hint = c.agent_hint
        AND x.call_id <> c.call_id
        AND x.call_id NOT IN (SELECT parent_call_id FROM linked)
),
first_calls AS (
    SELECT rollout_key, min(seq) AS first_seq FROM sc GROUP BY rollout_key
),
-- first calls of new chains that some earlier call of their rollout may have started
starts AS MATERIALIZED (
    SELECT c.*
    FROM sc AS c
    JOIN first_calls AS f USING (rollout_key)
    WHERE c.parent_call_id IS NULL
        AND c.seq > f.first_seq
        AND c.call_id NOT IN (SELECT call_id FROM retries)
),
-- rollouts with such starts: only their calls are looked at below
busy AS (SELECT DISTINCT rollout_key FROM starts),
-- when each call's conversation was first continued by its own agent
next_turn AS (
    SELECT parent_call_id AS call_id, min(seq) AS next_seq
    FROM linked
    WHERE kind = 'continues' AND rollout_key IN (SELECT rollout_key FROM busy)
    GROUP BY ALL
),
-- calls that may parent a new chain: not side calls
cand AS MATERIALIZED (
    SELECT c.call_id, c.rollout_key, c.seq, c.agent_hint, c.pid, c.n_tools, c.n_tool_calls,
        c.spawn_call, n.next_seq
    FROM sc AS c
    LEFT JOIN next_turn AS n USING (call_id)
    WHERE NOT c.is_side_call AND c.rollout_key IN (SELECT rollout_key FROM busy)
),
cand_tool AS (FROM cand WHERE n_tool_calls > 0),
cand_spawn AS (FROM cand WHERE spawn_call),
-- side calls: the latest non-side call of their own agent, else of the rollout
side_own AS (
    SELECT s.call_id AS child_call_id, p.call_id AS parent_call_id,
        CASE s.hint_source WHEN 'header' THEN 'header' WHEN 'process' THEN 'process_tree'
            ELSE 'time' END AS evidence, 1 AS rule
    FROM (FROM starts WHERE is_side_call) AS s
    ASOF JOIN cand AS p
        ON p.rollout_key = s.rollout_key AND p.agent_hint = s.agent_hint AND p.seq < s.seq
),
side_any AS (
    SELECT s.call_id AS child_call_id, p.call_id AS parent_call_id, 'time' AS evidence, 6 AS rule
    FROM (FROM starts WHERE is_side_call) AS s
    ASOF JOIN cand AS p ON p.rollout_key = s.rollout_key AND p.seq < s.seq
),
-- a new chain of an agent that already had one
same_agent AS (
    SELECT child_call_id, parent_call_id, kind,
        CASE
            WHEN kind = 'spawns' THEN 'time'
            WHEN hint_source = 'header' THEN 'header'
            WHEN hint_source = 'process' THEN 'process_tree'
            ELSE 'time'
        END AS evidence,
        3 AS rule
    FROM (
        SELECT s.call_id AS child_call_id, p.call_id AS parent_call_id, s.hint_source,
            CASE
                WHEN s.hint_source <> 'header' AND p.n_tool_calls > 0
                    AND (p.next_seq IS NULL OR p.next_seq > s.seq) THEN 'spawns'
                ELSE 'compacts'
            END AS kind
        FROM (FROM starts WHERE NOT is_side_call) AS s
        ASOF JOIN cand AS p
            ON p.rollout_key = s.rollout_key AND p.agent_hint = s.agent_hint AND p.seq < s.seq
        -- a chain without tools after one with tools is a helper (a probe), not the agent
        WHERE s.n_tools > 0 OR p.n_tools = 0
    )
),
by_header AS (
    SELECT s.call_id AS child_call_id,
        coalesce(ps.call_id, pt.call_id, pa.call_id) AS parent_call_id,
        'header' AS evidence, 4 AS rule
    FROM (FROM starts WHERE NOT is_side_call AND parent_hint IS NOT NULL) AS s
    ASOF LEFT JOIN cand_spawn AS ps
        ON ps.rollout_key = s.rollout_key AND ps.agent_hint = s.parent_hint AND ps.seq < s.seq
    ASOF LEFT JOIN cand_tool AS pt
        ON pt.rollout_key = s.rollout_key AND pt.agent_hint = s.parent_hint AND pt.seq < s.seq
    ASOF LEFT JOIN cand AS pa
        ON pa.rollout_key = s.rollout_key AND pa.agent_hint = s.parent_hint AND pa.seq < s.seq
),
ancestors AS (
    SELECT s.call_id, s.rollout_key, s.seq, s.pid,
        unnest(s.parent_pids) AS ancestor_pid,
        generate_subscripts(s.parent_pids, 1) AS distance
    FROM starts AS s
    WHERE len(s.parent_pids) > 0
),
-- (a join on the process, not ASOF: DuckDB runs an ASOF with few rows on its left as a
-- nested loop over every candidate)
by_process AS (
    SELECT
        a.call_id AS child_call_id,
        arg_max(
            p.call_id, {'distance': -a.distance, 'spawn': p.spawn_call, 'tool': p.n_tool_calls > 0,
                'seq': p.seq}
        ) AS parent_call_id,
        'process_tree' AS evidence,
        5 AS rule
    FROM ancestors AS a
    JOIN cand AS p ON p.rollout_key = a.rollout_key AND p.pid = a.ancestor_pid
    WHERE p.seq < a.seq AND a.ancestor_pid IS DISTINCT FROM a.pid
    GROUP BY a.call_id
),
by_time AS (
    SELECT s.call_id AS child_call_id,
        CASE
            WHEN ps.call_id IS NOT NULL AND (ps.next_seq IS NULL OR ps.next_seq > s.seq)
                THEN ps.call_id
            WHEN pt.next_seq IS NULL OR pt.next_seq > s.seq THEN pt.call_id
        END AS parent_call_id,
        'time' AS evidence, 7 AS rule
    FROM (FROM starts WHERE NOT is_side_call) AS s
    ASOF JOIN cand_tool AS pt ON pt.rollout_key = s.rollout_key AND pt.seq < s.seq
    ASOF LEFT JOIN cand_spawn AS ps ON ps.rollout_key = s.rollout_key AND ps.seq < s.seq
),
chain_starts AS (
    SELECT child_call_id, parent_call_id, kind, evidence
    FROM (
        SELECT child_call_id, parent_call_id, 'spawns' AS kind, evidence, rule FROM side_own
        UNION ALL
        SELECT child_call_id, parent_call_id, 'spawns', evidence, rule FROM side_any
        UNION ALL
        SELECT child_call_id, parent_call_id, kind, evidence, rule FROM same_agent
        UNION ALL
        SELECT child_call_id, parent_call_id, 'spawns', evidence, rule FROM by_header
        UNION ALL
        SELECT child_call_id, parent_call_id, 'spawns', evidence, rule FROM by_process
        UNION ALL
        SELECT child_call_id, parent_call_id, 'spawns', evidence, rule FROM by_time
    )
    WHERE parent_call_id IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY child_call_id ORDER BY rule) = 1
),
first_edges AS (
    SELECT child_call_id, parent_call_id, kind, evidence FROM linked
    UNION ALL
    SELECT * FROM chain_starts
),
-- a retry gets its original's parent (a link, or a chain start's edge)
retried AS (
    SELECT r.call_id AS child_call_id, e.parent_call_id,
        CASE
            WHEN e.kind = 'continues' AND c.is_side_call AND NOT p.is_side_call THEN 'spawns'
            ELSE e.kind
        END AS kind,
        e.evidence
    FROM retries AS r
    JOIN (
        -- (several retries of one call must not repeat its row)
        SELECT x.call_id AS of_call_id, x.parent_call_id, x.link_kind AS kind, x.evidence
        FROM sc AS x
        WHERE x.parent_call_id IS NOT NULL
            AND x.call_id IN (SELECT of_call_id FROM retries)
        UNION ALL
        SELECT child_call_id, parent_call_id, kind, evidence
        FROM chain_starts
    ) AS e USING (of_call_id)
    JOIN sc AS c ON c.call_id = r.call_id
    JOIN sc AS p ON p.call_id = e.parent_call_id
    WHERE p.seq < c.seq
)
SELECT
    c.call_id,
    c.rollout_id,
    c.rollout_key,
    c.seq,
    c.agent_hint,
    c.parent_hint,
    c.agent_label,
    c.is_side_call,
    c.is_prewarm,
    e.parent_call_id,
    e.kind,
    e.evidence
FROM sc AS c
LEFT JOIN (SELECT * FROM first_edges UNION ALL SELECT * FROM retried) AS e
    ON e.child_call_id = c.call_id
