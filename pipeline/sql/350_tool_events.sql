-- tool_events: every tool call and tool result of each rollout, read from its
-- conversation items (rollout_items) in the three API formats: Anthropic tool_use and
-- tool_result blocks, Chat assistant tool_calls and role tool messages, Responses
-- function_call / custom_tool_call / local_shell_call items and their *_output items.
-- A call and its result share tool_call_id. Items re-sent with changes repeat a tool
-- call id; the first occurrence is kept.
-- Grain: (rollout_id, kind, tool_call_id); seq orders a rollout's events.
CREATE OR REPLACE VIEW tool_events AS
WITH ri AS MATERIALIZED (
    SELECT rollout_id, seq, call_id, role, content_json
    FROM rollout_items
    -- only items that can hold a tool call or result need parsing
    WHERE contains(content_json, 'tool') OR contains(content_json, '_call')
),
-- Anthropic: content blocks of user and assistant messages.
blocks AS (
    SELECT
        rollout_id, seq, call_id,
        unnest(json_extract(content_json, '$.content[*]')) AS block,
        unnest(range(json_array_length(content_json, '$.content')::BIGINT)) AS idx
    FROM ri
    WHERE json_type(content_json, '$.content') = 'ARRAY'
        AND contains(content_json, '"tool_')
),
anthropic AS (
    SELECT
        rollout_id, seq, idx, call_id,
        CASE block ->> '$.type' WHEN 'tool_use' THEN 'call' ELSE 'result' END AS kind,
        coalesce(block ->> '$.id', block ->> '$.tool_use_id') AS tool_call_id,
        block ->> '$.name' AS tool_name,
        CASE WHEN block ->> '$.type' = 'tool_use' THEN (block -> '$.input')::VARCHAR END
            AS arguments,
        CASE
            WHEN block ->> '$.type' <> 'tool_result' THEN NULL
            WHEN json_type(block, '$.content') = 'VARCHAR' THEN block ->> '$.content'
            ELSE array_to_string(json_extract_string(block, '$.content[*].text'), '\n')
        END AS output,
        (block ->> '$.is_error')::BOOLEAN AS is_error
    FROM blocks
    WHERE block ->> '$.type' IN ('tool_use', 'tool_result')
),
-- Chat Completions: assistant tool_calls.
chat_calls AS (
    SELECT
        rollout_id, seq, call_id,
        unnest(json_extract(content_json, '$.tool_calls[*]')) AS tc,
        unnest(range(json_array_length(content_json, '$.tool_calls')::BIGINT)) AS idx
    FROM ri
    WHERE role = 'assistant' AND json_type(content_json, '$.tool_calls') = 'ARRAY'
),
chat AS (
    SELECT
        rollout_id, seq, idx, call_id, 'call' AS kind,
        tc ->> '$.id' AS tool_call_id,
        tc ->> '$.function.name' AS tool_name,
        tc ->> '$.function.arguments' AS arguments,
        NULL AS output,
        NULL::BOOLEAN AS is_error
    FROM chat_calls
    UNION ALL
    SELECT
        rollout_id, seq, 0, call_id, 'result',
        content_json ->> '$.tool_call_id',
        content_json ->> '$.name',
        NULL,
        CASE
            WHEN json_type(content_json, '$.content') = 'VARCHAR'
                THEN content_json ->> '$.content'
            ELSE array_to_string(json_extract_string(content_json, '$.content[*].text'), '\n')
        END,
        NULL
    FROM ri
    WHERE role = 'tool'
),
-- Responses: one item per call or output.
responses AS (
    SELECT
        rollout_id, seq, 0 AS idx, call_id,
        CASE WHEN content_json ->> '$.type' LIKE '%_output' THEN 'result' ELSE 'call' END
            AS kind,
        content_json ->> '$.call_id' AS tool_call_id,
        CASE content_json ->> '$.type'
            WHEN 'local_shell_call' THEN 'local_shell'
            ELSE content_json ->> '$.name'
        END AS tool_name,
        CASE content_json ->> '$.type'
            WHEN 'function_call' THEN content_json ->> '$.arguments'
            WHEN 'custom_tool_call' THEN content_json ->> '$.input'
            WHEN 'local_shell_call' THEN (content_json -> '$.action')::VARCHAR
        END AS arguments,
        CASE
            WHEN content_json ->> '$.type' NOT LIKE '%_output' THEN NULL
            WHEN json_type(content_json, '$.output') = 'VARCHAR'
                THEN content_json ->> '$.output'
            ELSE (content_json -> '$.output')::VARCHAR
        END AS output,
        NULL::BOOLEAN AS is_error
    FROM ri
    WHERE content_json ->> '$.type' IN (
        'function_call', 'function_call_output', 'custom_tool_call',
        'custom_tool_call_output', 'local_shell_call', 'local_shell_call_output'
    )
),
events AS (
    SELECT * FROM anthropic
    UNION ALL BY NAME
    SELECT * FROM chat
    UNION ALL BY NAME
    SELECT * FROM responses
),
firsts AS (
    SELECT *
    FROM events
    QUALIFY row_number() OVER (
        PARTITION BY rollout_id, kind, coalesce(tool_call_id, seq || ':' || idx)
        ORDER BY seq, idx
    ) = 1
),
named AS (
    -- A result takes its call's name and arguments.
    SELECT
        e.rollout_id, e.seq, e.idx, e.call_id, e.kind, e.tool_call_id,
        coalesce(c.tool_name, e.tool_name) AS tool_name,
        coalesce(e.arguments, c.arguments) AS arguments,
        e.output, e.is_error
    FROM firsts AS e
    LEFT JOIN firsts AS c
        ON e.kind = 'result' AND c.kind = 'call'
        AND c.rollout_id = e.rollout_id AND c.tool_call_id = e.tool_call_id
)
SELECT
    rollout_id::VARCHAR AS rollout_id,
    -- 1, 2, ... in conversation order within the rollout.
    row_number() OVER (PARTITION BY rollout_id ORDER BY seq, idx)::BIGINT AS seq,
    -- The LLM call whose request (results) or response (calls) carried it.
    call_id::VARCHAR AS call_id,
    -- call or result.
    kind::VARCHAR AS kind,
    tool_call_id::VARCHAR AS tool_call_id,
    tool_name::VARCHAR AS tool_name,
    -- Arguments as sent: JSON text (a string for freeform custom tools).
    arguments::VARCHAR AS arguments,
    -- Result text (results only).
    output::VARCHAR AS output,
    -- plan, edit, check or other (forge_tool_action), for calls and their results.
    forge_tool_action(tool_name, arguments)::VARCHAR AS action,
    -- Results only: the result reports a failure (forge_tool_failed).
    (CASE WHEN kind = 'result' THEN forge_tool_failed(is_error, output) END)::BOOLEAN
        AS failed
FROM named
