"""Task specs: what validates, and errors that name the file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k8s_jobs.tasks import (
    DEFAULT_TIMEOUT_S,
    TaskError,
    load_tasks,
    parse_duration,
    parse_tasks,
)

REPO = Path(__file__).resolve().parents[2]


def jsonl(*objs: object) -> str:
    return "\n".join(json.dumps(o) for o in objs)


def test_a_minimal_task_gets_defaults() -> None:
    (task,) = parse_tasks(jsonl({"id": "t1", "instruction": "do it"}), "x.jsonl")
    assert task.timeout_s == DEFAULT_TIMEOUT_S and task.verifier is None
    assert task.workspace.to_json() == {} and task.harness is None and task.source == "x.jsonl:1"


def test_every_field_parses(tmp_path: Path) -> None:
    (tmp_path / "fixture").mkdir()
    obj = {
        "id": "full.task-1",
        "instruction": "Fix it.",
        "workspace": {"dir": "fixture"},
        "harness": "codex",
        "timeout": "10m",
        "verifier": {"command": ["pytest", "-q"], "reward": "json", "timeout": 30},
        "environment": {"LEVEL": 3, "NAME": "x"},
        "metadata": {"source": "swe", "tags": ["a"]},
    }
    (task,) = parse_tasks(jsonl(obj), "t.jsonl", tmp_path)
    assert task.workspace.dir == (tmp_path / "fixture").resolve()
    assert task.timeout_s == 600.0 and task.harness == "codex"
    assert task.verifier is not None and task.verifier.argv() == ["pytest", "-q"]
    assert task.verifier.reward == "json" and task.verifier.timeout_s == 30
    assert task.environment == {"LEVEL": "3", "NAME": "x"}
    assert task.to_json()["metadata"] == {"source": "swe", "tags": ["a"]}


def test_a_string_verifier_runs_under_bash() -> None:
    (task,) = parse_tasks(jsonl({"id": "a", "instruction": "x", "verifier": "test -f a"}), "t")
    assert task.verifier is not None and task.verifier.argv() == ["bash", "-c", "test -f a"]
    assert task.verifier.reward == "exit_code"


def test_blank_and_comment_lines_are_skipped_and_lines_still_count() -> None:
    text = "\n// a comment\n" + json.dumps({"id": "a", "instruction": "x", "timeout": -1})
    with pytest.raises(TaskError, match=r"^t\.jsonl:3: task 'a': field 'timeout'"):
        parse_tasks(text, "t.jsonl")


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"id": "a b", "instruction": "x"}, r"t\.jsonl:2: field 'id'"),
        ({"id": "a", "instruction": ""}, r"t\.jsonl:2: task 'a': field 'instruction'"),
        ({"id": "a", "instruction": "x", "extra": 1}, r"unknown field\(s\) 'extra'.*metadata"),
        ({"id": "a", "instruction": "x", "timeout": "soon"}, r"field 'timeout': expected seconds"),
        (
            {"id": "a", "instruction": "x", "verifier": {"command": "t", "reward": "maybe"}},
            r"field 'verifier'\.reward: expected 'exit_code'",
        ),
        ({"id": "a", "instruction": "x", "verifier": {}}, r"field 'verifier'\.command"),
        (
            {"id": "a", "instruction": "x", "workspace": {"dir": "nowhere"}},
            r"field 'workspace'\.dir: no folder",
        ),
        (
            {"id": "a", "instruction": "x", "workspace": {"files": {"../up": "x"}}},
            r"field 'workspace'\.files: '\.\./up' must be a relative path",
        ),
        (
            {"id": "a", "instruction": "x", "workspace": {"files": {}, "dir": "."}},
            r"exactly one of 'files', 'dir' or 'git'",
        ),
        (
            {"id": "a", "instruction": "x", "environment": {"HTTPS_PROXY": "x"}},
            r"HTTPS_PROXY is set by the runner",
        ),
        ({"id": "a", "instruction": "x", "metadata": []}, r"field 'metadata': expected an object"),
        ([1, 2], r"t\.jsonl:2: a task is an object"),
    ],
)
def test_bad_tasks_are_refused_naming_line_and_field(obj: object, message: str) -> None:
    text = jsonl({"id": "ok", "instruction": "fine"}, obj)
    with pytest.raises(TaskError, match=message):
        parse_tasks(text, "t.jsonl", Path("/nonexistent-base"))


def test_duplicate_ids_name_both_lines() -> None:
    text = jsonl({"id": "a", "instruction": "x"}, {"id": "a", "instruction": "y"})
    with pytest.raises(
        TaskError, match=r"t\.jsonl:2: field 'id': 'a' is already used at t\.jsonl:1"
    ):
        parse_tasks(text, "t.jsonl")


def test_invalid_json_names_its_line() -> None:
    with pytest.raises(TaskError, match=r"t\.jsonl:2: not valid JSON"):
        parse_tasks('{"id": "a", "instruction": "x"}\n{"id": ', "t.jsonl")


def test_yaml_lists_and_task_mappings_parse_with_line_numbers() -> None:
    text = """
tasks:
  - id: one
    instruction: Do one.
    verifier:
      command: test -f one
  - id: two
    instruction: Do two.
    timeout: 1.5h
"""
    one, two = parse_tasks(text, "t.yaml")
    assert one.source == "t.yaml:3" and two.source == "t.yaml:7" and two.timeout_s == 5400
    with pytest.raises(TaskError, match=r"t\.yml:4: task 'b': field 'instruction'"):
        parse_tasks("- id: a\n  instruction: x\n\n- id: b\n  instruction: 3\n", "t.yml")


def test_yaml_that_is_not_a_list_is_refused() -> None:
    with pytest.raises(TaskError, match="expected a YAML list"):
        parse_tasks("id: a\ninstruction: x\n", "t.yaml")


def test_an_empty_file_has_no_tasks() -> None:
    with pytest.raises(TaskError, match="no tasks"):
        parse_tasks("\n\n", "t.jsonl")


def test_a_missing_file_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="no task file .* pass --tasks"):
        load_tasks(tmp_path / "none.jsonl")


@pytest.mark.parametrize(
    ("value", "seconds"), [(5, 5.0), (0.5, 0.5), ("90s", 90.0), ("2m", 120.0), ("250ms", 0.25)]
)
def test_durations(value: object, seconds: float) -> None:
    assert parse_duration(value, "x") == seconds


@pytest.mark.parametrize("value", [0, -1, True, "1d", float("nan"), 10**9])
def test_bad_durations(value: object) -> None:
    with pytest.raises(TaskError):
        parse_duration(value, "x")


def test_the_demo_tasks_validate_and_use_the_toy_harness() -> None:
    tasks = load_tasks(REPO / "data" / "tasks" / "demo.jsonl")
    assert len(tasks) >= 3 and {t.harness for t in tasks} == {"toy"}
    assert all(t.verifier is not None for t in tasks)
    assert any(t.verifier is not None and t.verifier.reward == "json" for t in tasks)
