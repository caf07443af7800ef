"""``forge loop``: rounds of serve-mode collection, snapshot and training, resumable after
kill -9 without losing or training twice any rollout."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.snapshot import read_manifest
from pipeline.store import connect
from rl.loop import LoopConfig, LoopError

TASK = {
    "id": "hello",
    "instruction": "Create hello.txt containing hi.",
    "timeout": 120,
    "verifier": {"command": 'test "$(cat hello.txt 2>/dev/null)" = hi'},
}


def write_config(tmp_path: Path, model: Path, confdir: Path, **more: object) -> Path:
    (tmp_path / "tasks.jsonl").write_text(json.dumps(TASK) + "\n")
    config = {
        "out": "loop",
        "model": str(model),
        "tasks": "tasks.jsonl",
        "harness": "toy",
        "rounds": 2,
        "n": 3,
        "parallel": 3,
        "serve_max_tokens": 64,
        "confdir": str(confdir),
        # The scripted policy calls `ls` every turn, so every rollout runs out of turns:
        # counted as failures (reward 0) and kept, each round has samples to train on.
        "grpo": {"partial": "zero", "zero_spread": "keep"},
        "train": {"sft": True, "lr": 1e-3},
        **more,
    }
    path = tmp_path / "loop.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


@pytest.mark.slow
def test_a_loop_killed_mid_round_resumes_and_trains_every_rollout_once(
    tmp_path: Path, confdir: Path, tiny_models: tuple[Path, Path]
) -> None:
    config = write_config(tmp_path, tiny_models[1], confdir)
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    cmd = [sys.executable, "-m", "forge_cli.main", "loop", "--config", str(config)]
    first = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run0 = tmp_path / "loop" / "runs" / "round-0"
    try:
        deadline = time.monotonic() + 300
        while True:  # kill -9 once round 0 has some rollouts ended and others running
            time.sleep(0.3)
            assert time.monotonic() < deadline and first.poll() is None
            if (run0 / "rollouts").is_dir():
                n = connect(run0).execute("SELECT count(*) FROM rollouts").fetchone()
                if n is not None and 1 <= n[0] < 3:
                    break
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    ended_before = {
        r[0] for r in connect(run0).execute("SELECT rollout_id FROM rollouts").fetchall()
    }

    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "loop"
    state = json.loads((out / "state.json").read_text())["rounds"]
    assert [r["done"] for r in state] == [["collect", "snapshot", "train"]] * 2
    assert [r["policy_version"] for r in state] == [0, 1]

    for k in (0, 1):
        run = connect(out / "runs" / f"round-{k}")
        ended = dict(run.execute("SELECT rollout_id, task_id FROM rollouts").fetchall())
        assert len(ended) == 3  # three rollouts per round, none lost, none run twice
        calls = dict(run.execute("SELECT rollout_id, count(*) FROM calls GROUP BY ALL").fetchall())
        assert all(calls[r] == 8 for r in ended)  # the toy harness's 8 turns, each once
        samples = read_manifest(out / "snapshots" / f"round-{k}")["tables"]["samples"]["rows"]
        assert samples == 24  # the ended rollouts' calls, and only theirs
        ckpt = json.loads((out / "checkpoints" / f"step-{k + 1}" / "forge.json").read_text())
        assert ckpt["policy_version"] == k + 1
        assert ckpt["snapshot"] == str((out / "snapshots" / f"round-{k}").resolve())
    # The rollouts that ended before the kill were kept, not run again.
    round0 = connect(run0)
    assert ended_before <= {
        r[0] for r in round0.execute("SELECT rollout_id FROM rollouts").fetchall()
    }
    assert not list(out.glob("checkpoints/.*"))  # no half-written checkpoint left
    curve = [json.loads(line) for line in (out / "curve.jsonl").read_text().splitlines()]
    assert [(c["round"], c["policy_version"], c["trained"]) for c in curve] == [
        (0, 0, True),
        (1, 1, True),
    ]
    # Each line says what the round's step did: its checkpoint's last metrics.
    for c in curve:
        metrics = out / "checkpoints" / f"step-{c['round'] + 1}" / "train_metrics.jsonl"
        last = json.loads(metrics.read_text().splitlines()[-1])
        assert (c["loss"], c["grad_norm"]) == (last["loss/sft"], last["grad/norm"])
        assert c["grad_norm"] > 0


@pytest.mark.slow
def test_collection_runs_ahead_of_training_by_at_most_the_staleness_bound(
    tmp_path: Path, confdir: Path, tiny_models: tuple[Path, Path]
) -> None:
    config = write_config(tmp_path, tiny_models[1], confdir, rounds=3, max_staleness=1)
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    cmd = [sys.executable, "-m", "forge_cli.main", "loop", "--config", str(config)]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "loop"
    state = json.loads((out / "state.json").read_text())["rounds"]
    assert [r["done"] for r in state] == [["collect", "snapshot", "train"]] * 3
    r0, r1, r2 = state
    # Round 1 collected with the starting policy while round 0 trained (one version
    # stale); round 2 waited for round 0's checkpoint, as the bound of 1 asks.
    assert [r0["policy_version"], r1["policy_version"]] == [0, 0]
    assert r1["times"]["collect"][0] < r0["times"]["train"][1]
    assert r2["times"]["collect"][0] >= r0["times"]["train"][1]
    assert r2["policy_version"] in (1, 2)
    # Training is one chain whatever collected: step k+1 from step k on round k's rollouts.
    parents = [tiny_models[1]] + [out / "checkpoints" / f"step-{k}" for k in (1, 2)]
    for k, parent in enumerate(parents):
        ckpt = json.loads((out / "checkpoints" / f"step-{k + 1}" / "forge.json").read_text())
        assert ckpt["policy_version"] == k + 1
        assert ckpt["parent_model"] == str(parent.resolve())
        assert ckpt["snapshot"] == str((out / "snapshots" / f"round-{k}").resolve())
        assert state[k]["trained_from"] == str(parent.resolve())
        # Every recorded call keeps the version of the policy that sampled it.
        run = connect(out / "runs" / f"round-{k}")
        versions = run.execute("SELECT DISTINCT policy_version FROM calls").fetchall()
        assert versions == [(state[k]["policy_version"],)]
    curve = [json.loads(line) for line in (out / "curve.jsonl").read_text().splitlines()]
    assert [c["round"] for c in curve] == [0, 1, 2]


def _harness_logs(out: Path, k: int, rollouts: Iterable[str]) -> dict[str, str]:
    """The tail of each rollout's harness output and of the round's proxy log: what a
    failure shows."""
    logs = out / "runs" / f"round-{k}" / "logs"
    tails = {
        f"{r}/{f.name}": f.read_text(errors="replace")[-1500:]
        for r in rollouts
        for f in sorted((logs / r).glob("*"))
    }
    proxy = out / "runs" / f"round-{k}" / "proxy.log"
    tails["proxy.log"] = proxy.read_text(errors="replace")[-3000:] if proxy.is_file() else ""
    return tails


@pytest.mark.slow
def test_a_grpo_loop_running_ahead_killed_at_every_phase_loses_and_repeats_nothing(
    tmp_path: Path, confdir: Path, tiny_models: tuple[Path, Path]
) -> None:
    """GRPO (not SFT), collection one version ahead of training (max_staleness 1), and a
    SIGKILL at each phase in turn (FORGE_LOOP_FAILPOINT): after a collect, after the
    snapshot, with a whole checkpoint not yet renamed (train), right after the rename
    (publish); the later kills land while the other thread collects. Resumed each time, the
    loop ends with every round's rollouts run once, trained once, on one chain, and the
    right policy versions on its calls and its curve."""
    config = write_config(
        tmp_path, tiny_models[1], confdir, rounds=3, max_staleness=1, train={"lr": 1e-3}
    )
    base_env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    cmd = [sys.executable, "-m", "forge_cli.main", "loop", "--config", str(config)]
    out = tmp_path / "loop"
    # Each point is still ahead when its run starts: round k trains only after round k-1.
    kills = ("collect:0", "snapshot:0", "train:0", "publish:0", "publish:1", "train:2", None)
    for failpoint in kills:
        env = dict(base_env)
        if failpoint:
            env["FORGE_LOOP_FAILPOINT"] = failpoint
        run = subprocess.Popen(
            cmd, cwd=tmp_path, env=env, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            _, err = run.communicate(timeout=600)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)  # whatever it had started (harnesses)
        if failpoint:
            assert run.returncode == -signal.SIGKILL, (failpoint, err[-2000:])
            assert f"FORGE_LOOP_FAILPOINT={failpoint}: killing" in err
        else:
            assert run.returncode == 0, err[-3000:]

    state = json.loads((out / "state.json").read_text())["rounds"]
    assert [r["done"] for r in state] == [["collect", "snapshot", "train"]] * 3
    versions = [r["policy_version"] for r in state]
    # Round 1 collected while round 0 trained; round 2 waited for round 0's checkpoint.
    assert versions[:2] == [0, 0] and versions[2] in (1, 2)
    trained: set[str] = set()
    for k in range(3):
        run_dir = connect(out / "runs" / f"round-{k}")
        ended = {r[0] for r in run_dir.execute("SELECT rollout_id FROM rollouts").fetchall()}
        assert len(ended) == 3, k  # none lost, none run twice
        calls = dict(
            run_dir.execute("SELECT rollout_id, count(*) FROM calls GROUP BY ALL").fetchall()
        )
        statuses = dict(run_dir.execute("SELECT rollout_id, status FROM rollouts").fetchall())
        short = {r: (calls.get(r, 0), statuses[r]) for r in ended if calls.get(r, 0) != 8}
        assert not short, (k, short, sorted(calls.items()), _harness_logs(out, k, short))
        sampled = run_dir.execute(
            "SELECT DISTINCT policy_version FROM calls WHERE rollout_id IN "
            "(SELECT rollout_id FROM rollouts)"
        ).fetchall()
        assert sampled == [(versions[k],)]  # the version that sampled them, on every call
        snap = out / "snapshots" / f"round-{k}"
        samples = read_manifest(snap)["tables"]["samples"]
        assert samples["rows"] == 24
        table = pq.read_table(snap / samples["path"], columns=["rollout_id", "call_ids"])
        assert set(table.column("rollout_id").to_pylist()) == ended  # this round's, all of them
        # Rollout ids are named per round (a retried attempt is <task>.<sample>.r1 in any
        # round), so "trained once" is checked on the calls, whose ids are unique everywhere.
        sampled_calls = {c for ids in table.column("call_ids").to_pylist() for c in ids}
        round_calls = {
            r[0]
            for r in run_dir.execute(
                "SELECT call_id FROM calls WHERE rollout_id IN (SELECT rollout_id FROM rollouts)"
            ).fetchall()
        }
        assert sampled_calls == round_calls and not sampled_calls & trained  # one snapshot each
        trained |= sampled_calls
        ckpt = json.loads((out / "checkpoints" / f"step-{k + 1}" / "forge.json").read_text())
        parent = tiny_models[1] if k == 0 else out / "checkpoints" / f"step-{k}"
        assert ckpt["policy_version"] == k + 1
        assert ckpt["parent_model"] == str(parent.resolve())  # one chain
        assert ckpt["snapshot"] == str(snap.resolve())
    assert not list(out.glob("checkpoints/.*"))  # no half-written checkpoint left
    curve_file = out / "curve.jsonl"
    curve = [json.loads(line) for line in curve_file.read_text().splitlines()]
    assert [(c["round"], c["policy_version"], c["trained"]) for c in curve] == [
        (k, versions[k], True) for k in range(3)
    ]
    # A stop between the state write and the curve append loses the round's line: the
    # next start writes it (and nothing twice).
    lines = curve_file.read_text().splitlines(keepends=True)
    curve_file.write_text("".join(lines[:-1]))
    again = subprocess.run(
        cmd, cwd=tmp_path, env=base_env, capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert curve_file.read_text() == "".join(lines)


def test_a_bad_config_says_what_is_wrong(tmp_path: Path) -> None:
    bad = tmp_path / "loop.yaml"
    bad.write_text("out: x\nmodel: y\n")
    with pytest.raises(LoopError, match="'tasks' is required"):
        LoopConfig.load(bad)
    bad.write_text("out: x\nmodel: y\ntasks: t\nround: 3\n")
    with pytest.raises(LoopError, match="unknown setting"):
        LoopConfig.load(bad)
    bad.write_text("out: x\nmodel: y\ntasks: t\nn: 0\n")
    with pytest.raises(LoopError, match="at least 1"):
        LoopConfig.load(bad)
    bad.write_text("out: x\nmodel: y\ntasks: t\nmax_staleness: -1\n")
    with pytest.raises(LoopError, match="max_staleness must be 0"):
        LoopConfig.load(bad)
    bad.write_text("out: x\nmodel: y\ntasks: t\npolicy_server: sglang\n")
    with pytest.raises(LoopError, match="policy_server must be one of forge, vllm, not 'sglang'"):
        LoopConfig.load(bad)
    (tmp_path / "vl").mkdir()
    (tmp_path / "vl" / "preprocessor_config.json").write_text("{}")
    bad.write_text(f"out: x\nmodel: {tmp_path / 'vl'}\ntasks: t\npolicy_server: vllm\n")
    with pytest.raises(LoopError, match="vision-language model: vLLM's completions take no images"):
        LoopConfig.load(bad)
    bad.write_text("out: x\nmodel: y\ntasks: t\ntrain: {lr: 1e-3, lrr: 2}\n")
    with pytest.raises(LoopError, match="train: unknown training setting.s. lrr"):
        LoopConfig.load(bad)
    bad.write_text("out: x\nmodel: y\ntasks: t\ntrain: {loss_agg_mode: nope}\n")
    with pytest.raises(LoopError, match="loss_agg_mode 'nope'"):
        LoopConfig.load(bad)
    bad.write_text("out: x\nmodel: y\ntasks: t\ntrain_args: [--lr, '1e-3']\n")
    with pytest.raises(LoopError, match="train_args .forge train flags. became train"):
        LoopConfig.load(bad)
    config = LoopConfig.load(Path("rl/config/demo.yaml"))
    assert config.rounds == 2 and config.out == Path("data/loop/demo")
    assert config.train == {"lr": 1e-3, "keep_optimizer": True}


def test_each_round_samples_its_tasks_from_the_split_by_seed_and_round(tmp_path: Path) -> None:
    from k8s_jobs.tasks import load_tasks
    from rl.demo_tasks import DEFAULT_OUT
    from rl.loop import round_tasks, select_split

    train = select_split(load_tasks(DEFAULT_OUT), "train")
    assert len(train) == 240 and all(t.metadata["split"] == "train" for t in train)
    config = LoopConfig(out=tmp_path, model=tmp_path, tasks=DEFAULT_OUT, tasks_per_round=6)
    first = [t.id for t in round_tasks(train, config, 0)]
    assert len(set(first)) == 6
    assert first == [t.id for t in round_tasks(train, config, 0)]  # a resumed round: the same
    assert first != [t.id for t in round_tasks(train, config, 1)]
    other_seed = LoopConfig(
        out=tmp_path, model=tmp_path, tasks=DEFAULT_OUT, tasks_per_round=6, seed=1
    )
    assert first != [t.id for t in round_tasks(train, other_seed, 0)]
    everyone = LoopConfig(out=tmp_path, model=tmp_path, tasks=DEFAULT_OUT)
    assert round_tasks(train, everyone, 3) == train
    with pytest.raises(LoopError, match="no task has split 'test'"):
        select_split(train, "test")
