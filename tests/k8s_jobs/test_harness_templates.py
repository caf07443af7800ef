"""Harness templates: the built-in command lines and environments, and user config files."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from k8s_jobs.harnesses import (
    HarnessTemplate,
    builtin_harnesses,
    load_harness_config,
    parse_harness_config,
    render,
    resolve_executable,
)
from mitm_addon.launch import ForgeError
from tests.support import harnesses as measured


def rendered(name: str, model: str | None = None, caller_env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return render(
        builtin_harnesses()[name],
        instruction="make hello.txt",
        workdir=Path("/w"),
        home=Path("/h"),
        rollout_id="t.0",
        task_id="t",
        model=model,
        caller_env=caller_env or {},
    )


def test_every_builtin_is_there() -> None:
    assert set(builtin_harnesses()) == {"claude", "codex", "opencode", "openclaw", "toy"}


def test_codex_runs_exec_unattended_with_a_model_and_its_key_variable() -> None:
    cmd = rendered("codex")
    assert cmd.argv[:2] == ("codex", "exec") and cmd.argv[-1] == "make hello.txt"
    for flag in ("--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"):
        assert flag in cmd.argv
    assert cmd.argv[cmd.argv.index("-m") + 1] == measured.CODEX_TEST_MODEL
    assert cmd.argv[cmd.argv.index("-C") + 1] == "/w"
    # The quiet switches docs/harnesses.md measured, in the same order.
    quiet = measured.CODEX_QUIET_ARGS
    i = cmd.argv.index(quiet[0])
    assert cmd.argv[i : i + len(quiet)] == quiet
    assert cmd.env["CODEX_API_KEY"] and cmd.env["CODEX_HOME"] == "/h/.codex"
    assert ".codex" in cmd.home_dirs


def test_claude_runs_print_mode_quietly() -> None:
    cmd = rendered("claude")
    assert cmd.argv == ("claude", "-p", "make hello.txt", "--dangerously-skip-permissions")
    assert measured.CLAUDE_QUIET_ENV.items() <= cmd.env.items()
    assert cmd.env["ANTHROPIC_API_KEY"]


def test_a_model_adds_the_model_flag_and_none_leaves_it_out() -> None:
    assert rendered("claude", model="claude-x").argv[-2:] == ("--model", "claude-x")
    assert "--model" not in rendered("openclaw", model="m").argv  # openclaw has no model_args


def test_keys_come_from_the_callers_environment_when_set() -> None:
    cmd = rendered("codex", caller_env={"CODEX_API_KEY": "sk-real", "UNRELATED": "x"})
    assert cmd.env["CODEX_API_KEY"] == "sk-real" and "UNRELATED" not in cmd.env


def test_toy_runs_this_python() -> None:
    cmd = rendered("toy")
    assert cmd.argv[:3] == (sys.executable, "-m", "k8s_jobs.toy_harness")
    assert cmd.argv[-1] == "make hello.txt"


def test_yaml_config_adds_and_extends_templates(tmp_path: Path) -> None:
    cfg = tmp_path / "h.yaml"
    cfg.write_text(
        """
harnesses:
  echoer:
    command: [bash, -c, "echo {instruction} > out.txt", "{model_args}"]
    env: {QUIET: 1}
    partial_exit_codes: [4]
  codex-mini:
    extends: codex
    model: gpt-mini
"""
    )
    templates = load_harness_config(cfg)
    assert templates["echoer"].partial_exit_codes == (4,)
    assert render(
        templates["echoer"],
        instruction="hi",
        workdir=Path("/w"),
        home=Path("/h"),
        rollout_id="r",
        task_id="t",
    ).argv == ("bash", "-c", "echo hi > out.txt")
    mini = templates["codex-mini"]
    assert mini.command == builtin_harnesses()["codex"].command and mini.model == "gpt-mini"
    assert "claude" in templates


def test_toml_config_works_too(tmp_path: Path) -> None:
    cfg = tmp_path / "h.toml"
    cfg.write_text('[harnesses.mine]\ncommand = ["mine", "{instruction}"]\n')
    assert load_harness_config(cfg)["mine"].command == ("mine", "{instruction}")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"command": ["x", "{prompt}"]}, r"unknown placeholder \{prompt\}"),
        ({"env": {"A": "b"}}, r"'command' is required"),
        ({"extends": "nope"}, r"extends 'nope', which is not defined"),
        ({"command": []}, r"must not be empty"),
        ({"command": ["x"], "colour": 1}, r"unknown field\(s\) \['colour'\]"),
        ({"command": ["x"], "partial_exit_codes": ["3"]}, r"list of integers"),
    ],
)
def test_bad_templates_are_refused_with_the_harness_named(spec: object, message: str) -> None:
    with pytest.raises(ForgeError, match=r"h\.yaml: harness 'bad'.*" + message):
        parse_harness_config({"harnesses": {"bad": spec}}, "h.yaml")


def test_a_config_without_harnesses_is_refused() -> None:
    with pytest.raises(ForgeError, match="expected a mapping 'harnesses:"):
        parse_harness_config({"tools": {}}, "h.yaml")


def test_programs_resolve_from_path_or_as_given(tmp_path: Path) -> None:
    prog = tmp_path / "tool"
    prog.write_text("#!/bin/sh\n")
    prog.chmod(0o755)
    assert resolve_executable("tool", str(tmp_path)) == str(prog)
    assert resolve_executable(str(prog)) == str(prog)
    assert resolve_executable("forge-no-such-tool", str(tmp_path)) is None


def test_a_template_is_plain_data() -> None:
    t = HarnessTemplate(name="x", command=("x",))
    assert t.env == {} and t.model is None
