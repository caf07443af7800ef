-- forge_tool_action(name, arguments): what a tool call does, for the behaviour views:
-- 'plan' (a plan or todo list update), 'edit' (changes files), 'check' (tests, lints,
-- type checks, builds, or reads back: cat, diff, git diff, ls, grep, a Read tool) or
-- 'other'. Grain: one tool call (scalar macro). A heuristic over tool names and, for
-- shell tools, the command text (arguments as sent, lower-cased); edits win over checks
-- in one command. Names cover Claude Code, Codex, opencode, Gemini CLI, Cline, Cursor and
-- the Anthropic and OpenAI reference tools.
CREATE OR REPLACE MACRO forge_tool_action(name, arguments) AS (
    CASE
        WHEN lower(name) IN ('todowrite', 'todo_write', 'write_todos', 'update_plan', 'updateplan')
            THEN 'plan'
        WHEN lower(name) IN ('str_replace_editor', 'str_replace_based_edit_tool', 'text_editor')
            THEN CASE
                WHEN regexp_matches(lower(coalesce(arguments, '')), '"command"\s*:\s*"view"')
                    THEN 'check'
                ELSE 'edit'
            END
        WHEN lower(name) IN (
            'edit', 'multiedit', 'write', 'notebookedit', 'apply_patch', 'patch',
            'write_file', 'edit_file', 'create_file', 'replace', 'write_to_file',
            'replace_in_file', 'search_replace', 'insert', 'str_replace', 'delete_file'
        )
            THEN 'edit'
        WHEN lower(name) IN (
            'read', 'read_file', 'view', 'view_file', 'open_file', 'cat', 'notebookread',
            'grep', 'glob', 'ls', 'list_dir', 'list_directory', 'list_files',
            'search_file_content', 'read_many_files'
        )
            THEN 'check'
        WHEN lower(name) IN (
            'bash', 'shell', 'exec_command', 'local_shell', 'container.exec', 'run_command',
            'run_terminal_cmd', 'terminal', 'execute_command', 'shell_command',
            'run_shell_command', 'exec', 'command'
        )
            THEN forge_shell_action(
                -- Redirections that write no file are not edits.
                regexp_replace(
                    lower(coalesce(arguments, '')), '[0-9&]?>>?\s*(/dev/null|&[0-9])', ' ', 'g'
                )
            )
        ELSE 'other'
    END
)
