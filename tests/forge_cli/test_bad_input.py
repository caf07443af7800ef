"""Bad input to every command ends in a one-line error and a non-zero exit, never a
traceback: missing, unreadable or unwritable paths, malformed task, config and snapshot
files, bad option values."""

from __future__ import annotations

from pathlib import Path

import pytest

from forge_cli.main import main


@pytest.fixture(scope="module")
def bad(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of broken inputs."""
    root = tmp_path_factory.mktemp("bad")
    (root / "empty").mkdir()
    (root / "malformed.json").write_text('{"model": "x", ')
    (root / "malformed.yaml").write_text("rounds: [1, 2\n  policy: {")
    (root / "list.yaml").write_text("- just\n- a list\n")
    (root / "tasks.jsonl").write_text('{"id": "t1", "instruction": "x"}\n{"id": \n')
    (root / "tasks-no-id.jsonl").write_text('{"instruction": "x"}\n')
    (root / "not-a-task.yaml").write_text("hello\n")
    (root / "binary.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    shards = root / "corrupt-run" / "calls"
    shards.mkdir(parents=True)
    (shards / "part-0.parquet").write_bytes(b"PAR1 this is not parquet")
    snap = root / "corrupt-snapshot"
    snap.mkdir()
    (snap / "manifest.json").write_text("{not json")
    (snap / "samples.parquet").write_bytes(b"junk")
    unreadable = root / "unreadable.yaml"
    unreadable.write_text("rounds: 1\n")
    unreadable.chmod(0)
    assert main(["init-model", "--tiny", "--out", str(root / "model")]) == 0
    return root


CASES = [
    # record
    ("record --out /proc/forge-x -- true", "/proc/forge-x"),
    ("record --out {bad}/run --upstream nohost -- true", "HOST=URL"),
    ("record --out {bad}/run --set forge_rotate_rows=0 -- true", "forge_rotate_rows"),
    ("record --out {bad}/run -- {bad}/no-such-binary", "no-such-binary"),
    # queries over a run directory
    ("sql --data {bad}/missing 'select 1'", "missing"),
    ("sql --data {bad}/corrupt-run 'select count(*) from calls'", "part-0.parquet"),
    ("sql --data {bad}/empty 'select * from nowhere'", "nowhere"),
    ("tree --data {bad}/missing", "missing"),
    ("view --data {bad}/missing --out {bad}/view", "missing"),
    ("view --data {bad}/empty --out /proc/forge-view", "no calls"),
    ("snapshot --data {bad}/missing --out {bad}/snap", "missing"),
    ("snapshot --data {bad}/empty --out /proc/forge-snap", "/proc/"),
    ("snapshot --data {bad}/empty --out {bad}/snap2 --where 'nonsense ((('", "nonsense"),
    ("export sft --data {bad}/missing --out {bad}/sft.parquet", "missing"),
    ("reward --data {bad}/missing --rollout r-1 --reward 1", "missing"),
    ("reward --data {bad}/empty --rollout r-1 --reward abc", "abc"),
    ("reward --data {bad}/empty --rollout r-1 --reward 1 --details '{{oops'", "details"),
    ("eval --data {bad}/missing", "missing"),
    ("eval --data {bad}/empty --k 0", "k"),
    # rollouts
    ("rollout --tasks {bad}/missing.jsonl --out {bad}/r1", "missing.jsonl"),
    ("rollout --tasks {bad}/tasks.jsonl --out {bad}/r2", "tasks.jsonl"),
    ("rollout --tasks {bad}/tasks-no-id.jsonl --out {bad}/r3", "tasks-no-id.jsonl"),
    ("rollout --tasks {bad}/not-a-task.yaml --out {bad}/r4", "not-a-task.yaml"),
    ("rollout --tasks {bad}/binary.jsonl --out {bad}/r5", "binary.jsonl"),
    ("rollout --tasks {bad}/malformed.yaml --out {bad}/r6", "malformed.yaml"),
    ("rollout --tasks {bad}/tasks-no-id.jsonl --out {bad}/r7 -n 0", "-n"),
    ("k8s render --tasks {bad}/malformed.yaml --out {bad}/k8s", "malformed.yaml"),
    # training
    ("train --model {bad}/model --snapshot {bad}/missing --out {bad}/ckpt", "missing"),
    ("train --model {bad}/model --snapshot {bad}/corrupt-snapshot --out {bad}/c", "corrupt"),
    ("train --model {bad}/model --snapshot {bad}/empty --out {bad}/ckpt", "empty"),
    ("train --model {bad}/model --chats {bad}/malformed.json --out {bad}/c --sft", "malformed"),
    ("train --model {bad}/model --snapshot {bad}/empty --out {bad}/c --lr -1", "lr"),
    ("loop --config {bad}/missing.yaml", "missing.yaml"),
    ("loop --config {bad}/malformed.yaml", "malformed.yaml"),
    ("loop --config {bad}/list.yaml", "list.yaml"),
    ("loop --config {bad}/unreadable.yaml", "unreadable.yaml"),
    ("loop --config {bad}/malformed.json", "malformed.json"),
    ("loop --config {bad}/list.yaml --rounds -3", "rounds"),
    # models
    ("init-model --tiny --out /proc/forge-model", "/proc/forge-model"),
    ("serve-policy --model {bad}/missing", "missing"),
    ("serve-policy --model {bad}/empty", "empty"),
    ("serve-policy --model {bad}/model --port 99999", "port"),
]


@pytest.mark.parametrize(("command", "said"), CASES, ids=[c for c, _ in CASES])
def test_bad_input_ends_in_one_line_error_not_a_traceback(
    bad: Path, command: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import shlex

    argv = shlex.split(command.format(bad=bad))
    try:
        code = main(argv)
    except SystemExit as e:  # argparse: a bad option value
        code = e.code if isinstance(e.code, int) else 2
    err = capsys.readouterr().err
    assert code != 0, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines, "nothing said"
    last = lines[-1]
    assert last.startswith("forge"), err
    assert said.lower() in last.lower(), err
    assert "FORGE_DEBUG" not in last, f"no command foresaw this input: {last}"
