"""Harness templates: the command line and environment of one unattended harness run.

Built in: ``claude`` (Claude Code), ``codex`` (Codex CLI), ``opencode``, ``openclaw`` and
``toy`` (``k8s_jobs/toy_harness.py``). Claude Code 2.1.332 and Codex 0.171.0 flags are the ones
measured in docs/harnesses.md; opencode's and OpenClaw's come from their documentation
(``opencode run --auto``, ``openclaw agent --local``) and are not exercised by the tests.

Users add or override templates in a YAML or TOML file (``--harness-config``)::

    harnesses:
      mytool:
        extends: codex                 # optional: start from a built-in template
        command: [mytool, run, "{model_args}", "{instruction}"]
        model: my-model
        model_args: ["--model", "{model}"]
        env: {MYTOOL_NO_TELEMETRY: "1"}
        pass_env: [MYTOOL_API_KEY]     # copied from the caller's environment when set
        home_dirs: [.mytool]           # created in the rollout's HOME
        partial_exit_codes: [3]        # exit codes that mean "stopped early" (status partial)

Placeholders: {instruction} {workdir} {home} {model} {rollout_id} {task_id} {python};
a command item that is exactly ``{model_args}`` expands to ``model_args`` when a model is
set and to nothing otherwise. Rendering is pure (``render``).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mitm_addon.launch import ForgeError

__all__ = [
    "HarnessCommand",
    "HarnessTemplate",
    "builtin_harnesses",
    "load_harness_config",
    "render",
    "resolve_executable",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
HARNESS_BIN_DIR = REPO_ROOT / ".harnesses" / "node_modules" / ".bin"
PLACEHOLDERS = ("instruction", "workdir", "home", "model", "rollout_id", "task_id", "python")
MODEL_ARGS = "{model_args}"
_PLACEHOLDER = re.compile(r"\{([A-Za-z_]+)\}")

# Claude Code: no telemetry, no auto-update, no non-essential traffic (docs/harnesses.md).
CLAUDE_QUIET_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
}
# Codex: no analytics, plugin marketplace or model-catalogue refresh (docs/harnesses.md).
CODEX_QUIET_ARGS = (
    "-c",
    "analytics.enabled=false",
    "--disable",
    "plugins",
    "--disable",
    "remote_plugin",
    "--disable",
    "api_key_model_discovery",
)
# Every harness: plain output, no colours, no pager, no interactive prompts.
COMMON_ENV = {"LANG": "C.UTF-8", "TERM": "dumb", "NO_COLOR": "1", "CI": "1", "PAGER": "cat"}


@dataclass(frozen=True)
class HarnessTemplate:
    """How to run one harness unattended; see the module docstring for the fields."""

    name: str
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    pass_env: tuple[str, ...] = ()
    model: str | None = None
    model_args: tuple[str, ...] = ()
    home_dirs: tuple[str, ...] = ()
    partial_exit_codes: tuple[int, ...] = ()
    description: str = ""


@dataclass(frozen=True)
class HarnessCommand:
    """A rendered template: run ``argv`` in the working directory with exactly ``env``
    (plus the proxy variables the runner adds), stdin closed."""

    argv: tuple[str, ...]
    env: dict[str, str]
    home_dirs: tuple[str, ...]


def builtin_harnesses() -> dict[str, HarnessTemplate]:
    """The built-in templates by name."""
    root = os.geteuid() == 0 if hasattr(os, "geteuid") else False
    return {
        "toy": HarnessTemplate(
            name="toy",
            command=("{python}", "-m", "k8s_jobs.toy_harness", "{model_args}", "{instruction}"),
            env={"OPENAI_API_KEY": "sk-forge-dummy", "PYTHONPATH": str(REPO_ROOT)},
            pass_env=("OPENAI_API_KEY",),
            model="gpt-4.1-mini",
            model_args=("--model", "{model}"),
            partial_exit_codes=(3,),  # "toy: out of turns"
            description="k8s_jobs/toy_harness.py: an openai-SDK agent with shell and consult tools",
        ),
        "claude": HarnessTemplate(
            name="claude",
            command=(
                "claude",
                "-p",
                "{instruction}",
                "--dangerously-skip-permissions",
                "{model_args}",
            ),
            # As root Claude Code refuses --dangerously-skip-permissions unless IS_SANDBOX=1.
            env={"ANTHROPIC_API_KEY": "sk-ant-forge-dummy", **CLAUDE_QUIET_ENV}
            | ({"IS_SANDBOX": "1"} if root else {}),
            pass_env=("ANTHROPIC_API_KEY",),
            model_args=("--model", "{model}"),
            description="Claude Code (claude -p), measured with 2.1.332",
        ),
        "codex": HarnessTemplate(
            name="codex",
            command=(
                "codex",
                "exec",
                "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox",
                "--color",
                "never",
                "-C",
                "{workdir}",
                *CODEX_QUIET_ARGS,
                "{model_args}",
                "{instruction}",
            ),
            # codex exec takes the key from CODEX_API_KEY (OPENAI_API_KEY alone sends no
            # Authorization header); CODEX_HOME must exist.
            env={
                "CODEX_API_KEY": "sk-forge-dummy",
                "OPENAI_API_KEY": "sk-forge-dummy",
                "CODEX_HOME": "{home}/.codex",
            },
            pass_env=("CODEX_API_KEY", "OPENAI_API_KEY"),
            # The default model (gpt-6.2-sol in 0.171.0) runs in code mode; -m picks the model.
            model="gpt-5.5",
            model_args=("-m", "{model}"),
            home_dirs=(".codex",),
            description="Codex CLI (codex exec), measured with 0.171.0",
        ),
        "opencode": HarnessTemplate(
            name="opencode",
            command=("opencode", "run", "--auto", "{model_args}", "{instruction}"),
            env={"OPENCODE_DISABLE_AUTOUPDATE": "1"},
            pass_env=("OPENAI_API_KEY", "ANTHROPIC_API_KEY"),
            model_args=("--model", "{model}"),
            description="opencode run --auto (flags from its documentation; not run in tests)",
        ),
        "openclaw": HarnessTemplate(
            name="openclaw",
            command=(
                "openclaw",
                "agent",
                "--local",
                "--session-id",
                "{rollout_id}",
                "--message",
                "{instruction}",
            ),
            pass_env=("OPENAI_API_KEY", "ANTHROPIC_API_KEY"),
            description="openclaw agent --local (flags from its documentation; not run in tests)",
        ),
    }


def load_harness_config(
    path: str | Path, base: Mapping[str, HarnessTemplate] | None = None
) -> dict[str, HarnessTemplate]:
    """The built-in templates (or ``base``) plus those of a YAML or TOML file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ForgeError(f"cannot read harness config {p}: {e.strerror or e}") from None
    data = _decode_config(text, str(p))
    return parse_harness_config(data, str(p), base)


def _decode_config(text: str, source: str) -> Any:
    if source.endswith(".toml"):
        import tomllib

        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ForgeError(f"{source}: not valid TOML: {e}") from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ForgeError(f"{source}: not valid YAML: {e}") from None


def parse_harness_config(
    data: Any, source: str, base: Mapping[str, HarnessTemplate] | None = None
) -> dict[str, HarnessTemplate]:
    """Templates from a decoded config (``{"harnesses": {name: {...}}}``), over ``base``."""
    templates = dict(builtin_harnesses() if base is None else base)
    if not isinstance(data, dict) or not isinstance(data.get("harnesses"), dict):
        raise ForgeError(f"{source}: expected a mapping 'harnesses: {{NAME: {{command: [...]}}}}'")
    for name, spec in data["harnesses"].items():
        templates[str(name)] = _parse_template(
            str(name), spec, f"{source}: harness {name!r}", templates
        )
    return templates


_TEMPLATE_FIELDS = (
    "extends",
    "command",
    "env",
    "pass_env",
    "model",
    "model_args",
    "home_dirs",
    "partial_exit_codes",
    "description",
)


def _parse_template(
    name: str, spec: Any, where: str, known: Mapping[str, HarnessTemplate]
) -> HarnessTemplate:
    if not isinstance(spec, dict):
        raise ForgeError(f"{where}: expected a mapping with at least 'command'")
    unknown = sorted(set(spec) - set(_TEMPLATE_FIELDS))
    if unknown:
        raise ForgeError(
            f"{where}: unknown field(s) {unknown}; valid: {', '.join(_TEMPLATE_FIELDS)}"
        )
    parent_name = spec.get("extends")
    if parent_name is not None:
        if parent_name not in known:
            raise ForgeError(
                f"{where}: extends {parent_name!r}, which is not defined; known: {sorted(known)}"
            )
        template = replace(known[parent_name], name=name)
    elif "command" not in spec:
        raise ForgeError(f"{where}: 'command' is required (a list: program and arguments)")
    else:
        template = HarnessTemplate(name=name, command=())
    changes: dict[str, Any] = {}
    for key in ("command", "pass_env", "model_args", "home_dirs"):
        if key in spec:
            changes[key] = _str_list(spec[key], f"{where}.{key}")
    if "command" in changes and not changes["command"]:
        raise ForgeError(f"{where}.command: must not be empty")
    if "env" in spec:
        env = spec["env"]
        if not isinstance(env, dict) or not all(
            isinstance(v, str | int | float) for v in env.values()
        ):
            raise ForgeError(f"{where}.env: expected a mapping of NAME -> string")
        changes["env"] = {**template.env, **{str(k): str(v) for k, v in env.items()}}
    if "model" in spec:
        if spec["model"] is not None and not isinstance(spec["model"], str):
            raise ForgeError(f"{where}.model: expected a model name")
        changes["model"] = spec["model"]
    if "partial_exit_codes" in spec:
        codes = spec["partial_exit_codes"]
        if not isinstance(codes, list) or not all(
            isinstance(c, int) and not isinstance(c, bool) for c in codes
        ):
            raise ForgeError(f"{where}.partial_exit_codes: expected a list of integers")
        changes["partial_exit_codes"] = tuple(codes)
    if "description" in spec:
        changes["description"] = str(spec["description"])
    template = replace(template, **changes)
    for item in (*template.command, *template.model_args, *template.env.values()):
        for placeholder in _PLACEHOLDER.findall(item):
            if placeholder not in PLACEHOLDERS and item != MODEL_ARGS:
                raise ForgeError(
                    f"{where}: unknown placeholder {{{placeholder}}} in {item!r}; "
                    f"valid: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}, {MODEL_ARGS}"
                )
    return template


def _str_list(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str | int | float) for v in value):
        raise ForgeError(f"{where}: expected a list of strings")
    return tuple(str(v) for v in value)


def _fill(text: str, values: Mapping[str, str]) -> str:
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), text)


def render(
    template: HarnessTemplate,
    *,
    instruction: str,
    workdir: Path,
    home: Path,
    rollout_id: str,
    task_id: str,
    model: str | None = None,
    caller_env: Mapping[str, str] | None = None,
) -> HarnessCommand:
    """The argv and environment of one run (pure: ``caller_env`` feeds ``pass_env``)."""
    chosen = model or template.model
    values = {
        "instruction": instruction,
        "workdir": str(workdir),
        "home": str(home),
        "model": chosen or "",
        "rollout_id": rollout_id,
        "task_id": task_id,
        "python": sys.executable,
    }
    argv: list[str] = []
    for item in template.command:
        if item == MODEL_ARGS:
            if chosen:
                argv += [_fill(a, values) for a in template.model_args]
        else:
            argv.append(_fill(item, values))
    env = dict(COMMON_ENV)
    env.update({k: _fill(v, values) for k, v in template.env.items()})
    source = os.environ if caller_env is None else caller_env
    for name in template.pass_env:
        if source.get(name):
            env[name] = source[name]
    return HarnessCommand(tuple(argv), env, template.home_dirs)


def resolve_executable(program: str, path: str | None = None) -> str | None:
    """A program's path: as given when it has a slash, else the pinned harness CLIs
    (.harnesses/node_modules/.bin), else PATH; None when it is nowhere."""
    if "/" in program:
        return program if os.access(program, os.X_OK) else None
    pinned = HARNESS_BIN_DIR / program
    if pinned.exists() and os.access(pinned, os.X_OK):
        return str(pinned)
    return shutil.which(program, path=path)
