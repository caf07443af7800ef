"""The learning demo's task suite and its sloppy expert."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from k8s_jobs.tasks import load_tasks
from rl.demo_rl import RIGHT, SLOPPY, ExpertScript
from rl.demo_tasks import DEFAULT_OUT, make_tasks, normalise, to_jsonl

KINDS = sorted({t["metadata"]["kind"] for t in make_tasks()})


def test_the_shipped_task_file_is_what_the_generator_writes() -> None:
    assert DEFAULT_OUT.read_text() == to_jsonl(make_tasks()), "run python -m rl.demo_tasks"


def test_the_suite_loads_with_disjoint_train_and_heldout_splits() -> None:
    tasks = load_tasks(DEFAULT_OUT)
    splits = [t.metadata["split"] for t in tasks]
    assert len(tasks) == 300 and splits.count("heldout") == 60 and splits.count("train") == 240
    assert len({t.id for t in tasks}) == len(tasks)
    held = {t.metadata["kind"] for t in tasks if t.metadata["split"] == "heldout"}
    assert sorted(held) == KINDS and len(KINDS) == 6


def test_no_heldout_task_shares_an_instruction_or_a_solution_with_a_train_task() -> None:
    """On the committed file: a held-out task seen in training, reworded or not, or one
    whose script (its solution) a policy ran in training, would measure memory."""
    tasks = load_tasks(DEFAULT_OUT)
    train = [t for t in tasks if t.metadata["split"] == "train"]
    held = [t for t in tasks if t.metadata["split"] == "heldout"]
    assert len(held) == 60
    seen_words = {normalise(t.instruction) for t in train}
    seen_scripts = {t.workspace.files["task.sh"] for t in train}
    assert [t.id for t in held if normalise(t.instruction) in seen_words] == []
    assert [t.id for t in held if t.workspace.files["task.sh"] in seen_scripts] == []
    # Nor within a split: every task is its own goal.
    assert len({t.workspace.files["task.sh"] for t in tasks}) == len(tasks)
    assert len({normalise(t.instruction) for t in tasks}) == len(tasks)


def test_instructions_are_compared_without_case_punctuation_or_spacing() -> None:
    assert normalise("Please write  the word fern to out.txt; use task.sh.") == (
        "please write the word fern to out txt use task sh"
    )


def _verify(task: Any, command: str, tmp_path: Path) -> bool:
    work = tmp_path / f"{task.id}-{len(list(tmp_path.iterdir()))}"
    work.mkdir()
    for name, text in task.workspace.files.items():
        (work / name).write_text(text)
    subprocess.run(["bash", "-c", command], cwd=work, capture_output=True, timeout=30)
    cmd = task.verifier.command
    done = subprocess.run(["bash", "-c", cmd], cwd=work, capture_output=True, timeout=30)
    return done.returncode == 0


@pytest.mark.parametrize("kind", KINDS)
def test_running_the_script_solves_a_task_and_the_sloppy_habits_do_not(
    kind: str, tmp_path: Path
) -> None:
    tasks = [t for t in load_tasks(DEFAULT_OUT) if t.metadata["kind"] == kind][:3]
    for task in tasks:
        assert _verify(task, RIGHT, tmp_path), task.id
        for sloppy in SLOPPY:
            assert not _verify(task, sloppy, tmp_path), (task.id, sloppy)


def test_the_expert_is_right_at_its_accuracy_and_the_same_for_a_task_every_time() -> None:
    expert = ExpertScript(0.3, seed=0)
    instructions = [t["instruction"] + str(i) for i, t in enumerate(make_tasks())]
    commands = [expert.command(s) for s in instructions]
    share = commands.count(RIGHT) / len(commands)
    assert 0.22 < share < 0.38
    assert set(commands) == {RIGHT, *SLOPPY}
    assert commands == [ExpertScript(0.3, seed=0).command(s) for s in instructions]
    assert commands != [ExpertScript(0.3, seed=1).command(s) for s in instructions]


def test_the_expert_finds_the_instruction_inside_a_real_harness_context() -> None:
    """Codex puts its environment context (with the rollout's working directory) in the
    first user message and the instruction in the next; Claude Code wraps it in content
    blocks beside its reminders. The coin is tossed on the task's instruction all the same."""
    task = 'Write the word "fern" to out.txt; use task.sh.'
    expert = ExpertScript(0.5, seed=0, instructions=["Create the directory a/b.", task])
    codex = [
        {"role": "system", "content": "You are Codex."},
        {"role": "user", "content": "<environment_context><cwd>/tmp/r7/work</cwd>"},
        {"role": "user", "content": task},
    ]
    claude = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>cwd /tmp/r9</system-reminder>"},
                {"type": "text", "text": task},
            ],
        }
    ]
    assert expert.instruction(codex) == expert.instruction(claude) == task
    # Without the task list: the first user message's text, as for the toy harness.
    assert ExpertScript(0.5, seed=0).instruction(codex) == codex[1]["content"]
