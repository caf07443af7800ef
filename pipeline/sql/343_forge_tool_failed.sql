-- forge_tool_failed(is_error, output): whether a tool result reports a failure: the
-- API's error flag (Anthropic tool_result is_error), else the output text: a non-zero
-- exit code (Codex's "exit_code" metadata or "Exit code: N", "exited with code N"), a
-- Python traceback, "command not found", Claude Code's <tool_use_error>, or a line that
-- starts with error: or fatal:. Grain: one tool result (scalar macro). A heuristic.
CREATE OR REPLACE MACRO forge_tool_failed(is_error, output) AS (
    coalesce(is_error, false)
    OR regexp_matches(
        coalesce(output, ''),
        '(?im)"exit_code"\s*:\s*-?[1-9]|exit(ed with)?\s+(exit\s+)?(code|status)\s*:?\s*-?[1-9]'
        || '|traceback \(most recent call last\)|command not found|<tool_use_error>'
        || '|^\s*(error|fatal)\s*:'
    )
)
