"""Task specs: parse and validate JSONL or YAML task files into ``Task`` values.

A task is one JSON object (a line of a ``.jsonl`` file, or an item of a YAML list, or of
the list under ``tasks:``)::

    {"id": "hello",                                   # [A-Za-z0-9._-], unique in the file
     "instruction": "Create hello.txt containing hi.",
     "workspace": {"files": {"README.md": "..."}}     # or {"dir": "fixtures/repo"}
                                                      # or {"git": "path/or/url", "ref": "main"}
     "harness": "toy",                                # optional; --harness overrides
     "timeout": 120,                                  # seconds, or "90s", "10m", "1h"
     "verifier": {"command": "test -f hello.txt",     # or a plain string
                  "reward": "exit_code",              # or "json": {"reward": x, "details": {...}}
                  "timeout": 60},
     "environment": {"NAME": "value"},
     "metadata": {...}}

Parsing is pure (``parse_tasks`` over text); ``load_tasks`` reads the file. Every error
names the file, the line and the field.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mitm_addon.launch import ForgeError

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "Task",
    "TaskError",
    "Verifier",
    "Workspace",
    "load_tasks",
    "parse_duration",
    "parse_tasks",
]

DEFAULT_TIMEOUT_S = 600.0  # a harness run on a small coding task: minutes, not hours
DEFAULT_VERIFIER_TIMEOUT_S = 120.0
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week: anything longer is a typo
TASK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Set by the runner for every rollout (proxy, CA trust, identity): a task may not override them.
RESERVED_ENV = frozenset(
    {
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "NO_PROXY",
        "no_proxy",
        "HOME",
        "FORGE_ROLLOUT_ID",
        "FORGE_TASK_ID",
    }
)
KNOWN_FIELDS = (
    "id",
    "instruction",
    "workspace",
    "harness",
    "timeout",
    "verifier",
    "environment",
    "metadata",
)
REWARD_MODES = ("exit_code", "json")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class TaskError(ForgeError):
    """A task file that does not validate; the message names file, line and field."""


@dataclass(frozen=True)
class Workspace:
    """What a rollout's working directory starts with: inline files, a folder's copy, or
    a clone of a git repository (at ``ref`` when given); empty when all are None."""

    files: dict[str, str] | None = None
    dir: Path | None = None
    git: str | None = None
    ref: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.files is not None:
            return {"files": dict(self.files)}
        if self.dir is not None:
            return {"dir": str(self.dir)}
        if self.git is not None:
            return {"git": self.git, **({"ref": self.ref} if self.ref else {})}
        return {}


@dataclass(frozen=True)
class Verifier:
    """A command run in the rollout's working directory after the harness; its exit code
    (0 gives reward 1, anything else 0) or its JSON on stdout gives the terminal reward."""

    command: tuple[str, ...] | str  # argv, or a bash script
    reward: str = "exit_code"
    timeout_s: float = DEFAULT_VERIFIER_TIMEOUT_S

    def argv(self) -> list[str]:
        return ["bash", "-c", self.command] if isinstance(self.command, str) else list(self.command)


@dataclass(frozen=True)
class Task:
    id: str
    instruction: str
    workspace: Workspace = field(default_factory=Workspace)
    harness: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    verifier: Verifier | None = None
    environment: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    source: str = field(default="<tasks>", compare=False)  # file:line, for messages

    def to_json(self) -> dict[str, Any]:
        """The task as a spec object again (relative paths already resolved)."""
        out: dict[str, Any] = {"id": self.id, "instruction": self.instruction}
        if ws := self.workspace.to_json():
            out["workspace"] = ws
        if self.harness:
            out["harness"] = self.harness
        out["timeout"] = self.timeout_s
        if self.verifier is not None:
            cmd = self.verifier.command
            out["verifier"] = {
                "command": cmd if isinstance(cmd, str) else list(cmd),
                "reward": self.verifier.reward,
                "timeout": self.verifier.timeout_s,
            }
        if self.environment:
            out["environment"] = dict(self.environment)
        if self.metadata:
            out["metadata"] = self.metadata
        return out


def parse_duration(value: Any, where: str) -> float:
    """Seconds from a number or a string such as ``"90s"``, ``"10m"``, ``"1.5h"``."""
    if isinstance(value, bool):
        raise TaskError(f'{where}: expected seconds (e.g. 120 or "10m"), not {value!r}')
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    else:
        raise TaskError(f'{where}: expected seconds (e.g. 120 or "10m"), not {value!r}')
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_TIMEOUT_S:
        raise TaskError(
            f"{where}: must be more than 0 and at most {MAX_TIMEOUT_S:g} s, not {value!r}"
        )
    return seconds


def parse_tasks(text: str, source: str, base_dir: Path | None = None) -> list[Task]:
    """Tasks from the text of a ``.jsonl`` file, or of a YAML one when ``source`` ends in
    ``.yaml``/``.yml``. Relative workspace paths resolve against ``base_dir``."""
    base = base_dir or Path.cwd()
    yaml_file = source.endswith((".yaml", ".yml"))
    items = _yaml_items(text, source) if yaml_file else _jsonl_items(text, source)
    if not items:
        raise TaskError(f"{source}: no tasks (expected one JSON object per line, or a YAML list)")
    tasks: list[Task] = []
    seen: dict[str, str] = {}
    for line, obj in items:
        where = f"{source}:{line}"
        task = parse_task(obj, where, base)
        if task.id in seen:
            raise TaskError(f"{where}: field 'id': {task.id!r} is already used at {seen[task.id]}")
        seen[task.id] = where
        tasks.append(task)
    return tasks


def load_tasks(path: str | Path) -> list[Task]:
    """Read and validate a task file (JSONL, or YAML by its extension)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskError(f"no task file {p}: pass --tasks with a .jsonl or .yaml file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"cannot read task file {p}: {e}") from None
    return parse_tasks(text, str(p), p.resolve().parent)


def _jsonl_items(text: str, source: str) -> list[tuple[int, Any]]:
    items = []
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("//"):
            continue
        try:
            items.append((n, json.loads(line)))
        except ValueError as e:
            raise TaskError(
                f"{source}:{n}: not valid JSON ({e}); one task object per line"
            ) from None
    return items


def _yaml_items(text: str, source: str) -> list[tuple[int, Any]]:
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise TaskError(f"{source}: not valid YAML: {e}") from None
    if isinstance(data, dict) and isinstance(node, yaml.MappingNode) and "tasks" in data:
        node = next(v for k, v in node.value if k.value == "tasks")
        data = data["tasks"]
    if not isinstance(data, list) or not isinstance(node, yaml.SequenceNode):
        raise TaskError(f"{source}: expected a YAML list of tasks (or a mapping with 'tasks:')")
    return [(child.start_mark.line + 1, item) for child, item in zip(node.value, data, strict=True)]


def parse_task(obj: Any, where: str, base: Path) -> Task:
    """One task from its decoded object; ``where`` (file:line) prefixes every error."""
    if not isinstance(obj, dict):
        raise TaskError(
            f"{where}: a task is an object with 'id' and 'instruction', not {type(obj).__name__}"
        )
    unknown = sorted(set(obj) - set(KNOWN_FIELDS))
    if unknown:
        raise TaskError(
            f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; "
            f"valid fields: {', '.join(KNOWN_FIELDS)} (put anything else under 'metadata')"
        )
    task_id = obj.get("id")
    if not isinstance(task_id, str) or not TASK_ID.match(task_id):
        raise TaskError(
            f"{where}: field 'id': expected 1-128 characters from [A-Za-z0-9._-] starting with a "
            f"letter or digit (it becomes part of rollout ids and proxy user names), not {task_id!r}"
        )
    source, where = where, f"{where}: task {task_id!r}"
    instruction = obj.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        raise TaskError(f"{where}: field 'instruction': expected a non-empty string")
    harness = obj.get("harness")
    if harness is not None and (not isinstance(harness, str) or not harness):
        raise TaskError(
            f"{where}: field 'harness': expected a harness name such as 'toy' or 'codex'"
        )
    timeout = (
        parse_duration(obj["timeout"], f"{where}: field 'timeout'")
        if "timeout" in obj
        else DEFAULT_TIMEOUT_S
    )
    return Task(
        id=task_id,
        instruction=instruction,
        workspace=_parse_workspace(obj.get("workspace"), where, base),
        harness=harness,
        timeout_s=timeout,
        verifier=_parse_verifier(obj.get("verifier"), where),
        environment=_parse_environment(obj.get("environment"), where),
        metadata=_parse_metadata(obj.get("metadata"), where),
        source=source,
    )


def _parse_workspace(value: Any, where: str, base: Path) -> Workspace:
    if value is None:
        return Workspace()
    field_ = f"{where}: field 'workspace'"
    if not isinstance(value, dict):
        raise TaskError(f"{field_}: expected an object with one of 'files', 'dir' or 'git'")
    kinds = [k for k in ("files", "dir", "git") if k in value]
    extra = sorted(set(value) - {"files", "dir", "git", "ref"})
    if len(kinds) != 1 or extra:
        raise TaskError(
            f"{field_}: expected exactly one of 'files', 'dir' or 'git' (plus 'ref' with 'git'), "
            f"got {sorted(value)}"
        )
    if "ref" in value and kinds != ["git"]:
        raise TaskError(f"{field_}.ref: 'ref' goes with 'git' only")
    if kinds == ["files"]:
        files = value["files"]
        if not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in files.items()
        ):
            raise TaskError(f"{field_}.files: expected an object of relative path -> text")
        for name in files:
            _check_relative(name, f"{field_}.files")
        return Workspace(files=dict(files))
    if kinds == ["dir"]:
        d = value["dir"]
        if not isinstance(d, str) or not d:
            raise TaskError(f"{field_}.dir: expected a folder path")
        path = (base / d).resolve()
        if not path.is_dir():
            raise TaskError(f"{field_}.dir: no folder {path}")
        return Workspace(dir=path)
    git, ref = value["git"], value.get("ref")
    if not isinstance(git, str) or not git:
        raise TaskError(f"{field_}.git: expected a repository path or URL")
    if ref is not None and (not isinstance(ref, str) or not ref or ref.startswith("-")):
        raise TaskError(f"{field_}.ref: expected a branch, tag or commit, not {ref!r}")
    if "://" not in git and not git.startswith("git@"):
        local = (base / git).resolve()
        if not local.exists():
            raise TaskError(f"{field_}.git: no repository at {local}")
        git = str(local)
    return Workspace(git=git, ref=ref)


def _check_relative(name: str, where: str) -> None:
    p = Path(name)
    if not name or p.is_absolute() or ".." in p.parts:
        raise TaskError(f"{where}: {name!r} must be a relative path inside the workspace")


def _parse_verifier(value: Any, where: str) -> Verifier | None:
    if value is None:
        return None
    field_ = f"{where}: field 'verifier'"
    if isinstance(value, str | list):
        value = {"command": value}
    if not isinstance(value, dict):
        raise TaskError(f"{field_}: expected a command string or an object with 'command'")
    extra = sorted(set(value) - {"command", "reward", "timeout"})
    if extra:
        raise TaskError(f"{field_}: unknown field(s) {extra}; valid: command, reward, timeout")
    cmd = value.get("command")
    if isinstance(cmd, list):
        if not cmd or not all(isinstance(a, str) for a in cmd):
            raise TaskError(f"{field_}.command: expected a non-empty list of strings")
        command: tuple[str, ...] | str = tuple(cmd)
    elif isinstance(cmd, str) and cmd.strip():
        command = cmd
    else:
        raise TaskError(f"{field_}.command: expected a bash command string or an argv list")
    mode = value.get("reward", "exit_code")
    if mode not in REWARD_MODES:
        raise TaskError(
            f"{field_}.reward: expected 'exit_code' (0 gives 1.0, else 0.0) or 'json' "
            f'(stdout\'s last line is {{"reward": x, "details": {{...}}}}), not {mode!r}'
        )
    timeout = (
        parse_duration(value["timeout"], f"{field_}.timeout")
        if "timeout" in value
        else DEFAULT_VERIFIER_TIMEOUT_S
    )
    return Verifier(command=command, reward=mode, timeout_s=timeout)


def _parse_environment(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    field_ = f"{where}: field 'environment'"
    if not isinstance(value, dict):
        raise TaskError(f"{field_}: expected an object of NAME -> string")
    env: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not ENV_NAME.match(k):
            raise TaskError(f"{field_}: {k!r} is not a variable name")
        if k in RESERVED_ENV:
            raise TaskError(
                f"{field_}: {k} is set by the runner for every rollout and cannot be overridden"
            )
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise TaskError(f"{field_}.{k}: expected a string, not {type(v).__name__}")
        env[k] = str(v)
    return env


def _parse_metadata(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TaskError(f"{where}: field 'metadata': expected an object")
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        raise TaskError(f"{where}: field 'metadata': holds NaN or Infinity") from None
    return dict(value)
