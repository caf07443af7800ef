-- forge_shell_action(command): 'edit', 'check' or 'other' for the text of a shell
-- command (lower-cased, redirections to /dev/null or a descriptor already removed): it
-- edits when it patches, moves, copies, removes, creates or redirects into a file, and
-- checks when it runs tests, lints, type checks or builds, or reads files back (cat,
-- head, tail, diff, git diff, grep, ls, wc, test -f). Edits win over checks.
-- Grain: one command (scalar macro); used by forge_tool_action. A heuristic.
CREATE OR REPLACE MACRO forge_shell_action(command) AS (
    CASE
        WHEN regexp_matches(
            command,
            'apply_patch|\bsed\s+-i|\bperl\s+-p?i|\btee\b|\bmv\s|\bcp\s|\brm\s|\btouch\s'
            || '|\bmkdir\s|\bpatch\s|\bgit\s+(apply|checkout|restore|mv|rm)\b'
            || '|(^|[^-=<>0-9&])>>?\s*[^\s=&>|)]'
        )
            THEN 'edit'
        WHEN regexp_matches(
            command,
            '\b(pytest|py\.test|unittest|tox|nox|ruff|mypy|pyright|flake8|pylint'
            || '|eslint|prettier|tsc|jest|vitest|mocha|rspec|phpunit|ctest|gradle|mvn'
            || '|cargo\s+(test|check|clippy|build)|go\s+(test|vet|build)'
            || '|(npm|yarn|pnpm|bun)\s+(run\s+)?(test|lint|build|check)|make'
            || '|cat|head|tail|less|diff|cmp|git\s+(diff|status|show)|grep|rg|ls|stat'
            || '|wc|test\s+-[a-z]|bash\s+-n|node\s+--check|py_compile'
            || '|python[0-9.]*\s+\S+\.py|node\s+\S+\.[cm]?js)\b'
        )
            THEN 'check'
        ELSE 'other'
    END
)
