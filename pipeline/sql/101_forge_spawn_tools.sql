-- forge_spawn_tools(): names of the tools with which harnesses start a sub-agent (Claude
-- Code Agent, formerly Task; Codex spawn_agent; opencode task). A call that asked for one
-- is preferred as the parent of a sub-agent's first call. Grain: one list (scalar macro).
CREATE OR REPLACE MACRO forge_spawn_tools() AS ['Agent', 'Task', 'spawn_agent', 'task']
