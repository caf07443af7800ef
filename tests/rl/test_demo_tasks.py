"""The learning demo's task suite and its sloppy expert."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from k8s_jobs.tasks import load_tasks
from rl.demo_rl import RIGHT, SLOPPY, ExpertScript
from rl.demo_tasks import DEFAULT_OUT, make_tasks, to_jsonl

KINDS = sorted({t["metadata"]["kind"] for t in make_tasks()})


def test_the_shipped_task_file_is_what_the_generator_writes() -> None:
    assert DEFAULT_OUT.read_text() == to_jsonl(make_tasks()), "run python -m rl.demo_tasks"


def test_the_suite_loads_with_disjoint_train_and_heldout_splits() -> None:
    tasks = load_tasks(DEFAULT_OUT)
    splits = [t.metadata["split"] for t in tasks]
    assert len(tasks) == 300 and splits.count("heldout") == 60 and splits.count("train") == 240
    assert len({t.id for t in tasks}) == len(tasks)
    # No task twice (a held-out task seen in training would measure memory).
    assert len({(t.instruction, str(t.workspace.files)) for t in tasks}) == len(tasks)
    held = {t.metadata["kind"] for t in tasks if t.metadata["split"] == "heldout"}
    assert sorted(held) == KINDS and len(KINDS) == 6


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
