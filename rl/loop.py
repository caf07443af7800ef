"""``forge loop``: collect with the current policy, snapshot, train, publish; repeat.

Each round ``k`` has three phases, each with an output written once:

- collect: the policy (checkpoint ``k``) is served by the embedded policy server, and the
  task file's rollouts run against it in serve mode into ``OUT/runs/round-k``;
- snapshot: ``OUT/snapshots/round-k``, immutable (GRPO groups, samples);
- train: one pass over that snapshot into ``OUT/checkpoints/step-(k+1)``, renamed into
  place when whole. The next round serves it (the publish step).

With ``max_staleness: S`` (default 0, synchronous), collection may run ahead of
training: round ``k`` collects with the newest checkpoint trained so far, waiting only
until round ``k-1-S`` has trained, so with ``S = 1`` round ``k+1``'s rollouts run while
round ``k`` trains. Training stays one chain (step ``k+1`` is trained from step ``k`` on
round ``k``'s snapshot, whichever policy collected it): samples from a policy up to ``S``
versions old are corrected by the importance ratio against their recorded sampling
logprobs, which PPO's clip bounds. Every row keeps the version that sampled it.

``OUT/state.json`` (replaced atomically) records the finished phases. A loop killed at
any point and started again resumes where it stopped, and trains every rollout once:
a collect phase resumes its run directory (``forge rollout --resume``: rollouts that
ended are kept, the others rerun under new ids, so a rollout cut short is never
trained); a snapshot or checkpoint that exists is the phase's output, never rewritten;
a half-written checkpoint (its temporary folder) is removed and trained again from
the same snapshot.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATE_FILE = "state.json"
CURVE_FILE = "curve.jsonl"
POLICY_SERVERS = ("forge", "vllm")
PHASES = ("collect", "snapshot", "train")
# Fault injection for the kill tests: the loop SIGKILLs itself (as an OOM killer or a
# preempted node would) when it reaches the point this variable names, e.g. "publish:1".
FAILPOINT_ENV = "FORGE_LOOP_FAILPOINT"


class LoopError(ValueError):
    """A loop configuration or state that cannot be run."""


@dataclass(frozen=True)
class LoopConfig:
    """One ``forge loop`` configuration (a YAML file; relative paths from its folder)."""

    out: Path
    """Loop directory: state.json, curve.jsonl, runs/, snapshots/, checkpoints/."""
    model: Path
    """The starting policy: a Hugging Face model folder (its forge.json gives its version)."""
    tasks: Path
    rounds: int = 1
    harness: str | None = None
    n: int = 4
    """Rollouts per task and round: the GRPO group size."""
    parallel: int = 4
    timeout_s: float | None = None
    serve_max_tokens: int = 0
    grpo: dict[str, Any] = field(default_factory=dict)
    """GRPO grouping rules (``forge snapshot --grpo NAME=VALUE``)."""
    train: dict[str, Any] = field(default_factory=dict)
    """Training settings by name (``rl.train.settings_from``): TrainSettings' and
    LossSettings' fields and ``keep_optimizer``, e.g. ``{lr: 1e-3, sft: true}``."""
    confdir: Path | None = None
    split: str | None = None
    """Only the tasks whose ``metadata.split`` is this (e.g. ``train``)."""
    tasks_per_round: int | None = None
    """A seeded sample of this many tasks each round (None: every task, every round)."""
    seed: int = 0
    """Seeds each round's task sample (round k's sample depends on seed and k only)."""
    max_staleness: int = 0
    """How many policy versions a round's collection may lag the synchronous schedule:
    0 collects each round with the previous round's checkpoint; S >= 1 lets round k
    collect while rounds up to k-1 train, waiting only for round k-1-S's checkpoint."""
    policy_server: str = "forge"
    """What serves the policy: ``forge`` (the embedded server, started for each round's
    checkpoint) or ``vllm`` (one ``vllm serve`` for the whole loop, each new checkpoint
    published into it between rounds: ``rl.policy.vllm``)."""
    vllm_python: str | None = None
    """vLLM's python (default ``FORGE_VLLM_PYTHON``, else ``.venv-vllm/bin/python``)."""
    vllm_args: list[str] | None = None
    """Extra ``vllm serve`` flags (default ``--dtype float32``)."""

    @classmethod
    def load(cls, path: str | Path) -> LoopConfig:
        import yaml

        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise LoopError(f"no loop configuration {p}") from None
        except yaml.YAMLError as e:
            raise LoopError(f"{p}: not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise LoopError(f"{p}: expected a mapping of settings")
        if "train_args" in data:
            raise LoopError(
                f"{p}: train_args (forge train flags) became train, a mapping of settings: "
                "e.g. train: {lr: 1e-3, keep_optimizer: true} for --lr 1e-3 --keep-optimizer"
            )
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise LoopError(f"{p}: unknown setting(s) {', '.join(unknown)}; known: {sorted(known)}")
        for name in ("out", "model", "tasks"):
            if name not in data:
                raise LoopError(f"{p}: '{name}' is required")
        base = p.parent

        def path_of(value: Any) -> Path:
            q = Path(str(value)).expanduser()
            return q if q.is_absolute() else Path(os.path.normpath(base / q))

        values = dict(data)
        for name in ("out", "model", "tasks", "confdir"):
            if values.get(name) is not None:
                values[name] = path_of(values[name])
        values["train"] = dict(values.get("train") or {})
        values["grpo"] = dict(values.get("grpo") or {})
        try:
            config = cls(**values)
        except TypeError as e:
            raise LoopError(f"{p}: {e}") from None
        if config.rounds < 1 or config.n < 1 or config.parallel < 1:
            raise LoopError(f"{p}: rounds, n and parallel must be at least 1")
        if config.tasks_per_round is not None and config.tasks_per_round < 1:
            raise LoopError(f"{p}: tasks_per_round must be at least 1")
        if config.max_staleness < 0:
            raise LoopError(f"{p}: max_staleness must be 0 (synchronous) or more")
        if config.policy_server not in POLICY_SERVERS:
            raise LoopError(
                f"{p}: policy_server must be one of {', '.join(POLICY_SERVERS)}, "
                f"not {config.policy_server!r}"
            )
        from rl.tiny_vl_model import is_vision_model

        if config.policy_server == "vllm" and is_vision_model(config.model):
            raise LoopError(
                f"{p}: {config.model} is a vision-language model: vLLM's completions take no "
                "images with a token prompt; serve it with policy_server: forge"
            )
        from rl.train import TrainError, settings_from

        try:
            settings_from(config.train)  # refused now, not after the first collect
        except TrainError as e:
            raise LoopError(f"{p}: train: {e}") from None
        return config


@dataclass
class RoundRecord:
    round: int
    policy: str
    """The checkpoint that collected this round."""
    policy_version: int
    done: list[str] = field(default_factory=list)
    """Finished phases, in order."""
    rollouts: int = 0
    mean_reward: float | None = None
    samples: int = 0
    checkpoint: str | None = None
    """The checkpoint this round trained, or None if it had no samples and the policy it
    started from carried over unchanged."""
    trained_from: str | None = None
    """The policy this round's training started from: the previous round's result (its
    ``policy`` in a synchronous loop; newer when collection ran ahead)."""
    times: dict[str, list[float]] = field(default_factory=dict)
    """Each finished phase's start and end (Unix seconds)."""

    def result(self) -> str:
        """The policy this round leaves once trained: its checkpoint, or the one its
        training started from."""
        return self.checkpoint or self.trained_from or self.policy


@dataclass
class LoopState:
    rounds: list[RoundRecord] = field(default_factory=list)

    @classmethod
    def read(cls, out: Path) -> LoopState:
        path = out / STATE_FILE
        if not path.is_file():
            return cls()
        data = json.loads(path.read_text())
        return cls([RoundRecord(**r) for r in data["rounds"]])

    def write(self, out: Path) -> None:
        """Replace the state file atomically (write, fsync, rename)."""
        from pipeline.atomic import write_atomic

        out.mkdir(parents=True, exist_ok=True)
        state = json.dumps({"rounds": [asdict(r) for r in self.rounds]}, indent=2)
        write_atomic(out / STATE_FILE, state)


def _failpoint(point: str, k: int) -> None:
    """Die here if ``FORGE_LOOP_FAILPOINT`` names this point of round ``k``:
    ``collect`` (its rollouts ended, the phase not yet recorded), ``snapshot`` (written,
    not recorded), ``train`` (the checkpoint whole in its temporary folder, not renamed)
    or ``publish`` (renamed into place, not recorded)."""
    if os.environ.get(FAILPOINT_ENV) == f"{point}:{k}":
        _say(f"{FAILPOINT_ENV}={point}:{k}: killing this process")
        os.kill(os.getpid(), signal.SIGKILL)


def _say(message: str) -> None:
    print(f"forge loop: {message}", file=sys.stderr, flush=True)


def run_loop(
    config: LoopConfig,
    after_phase: Callable[[int, str], None] | None = None,
    on_round: Callable[[dict[str, Any], int], None] | None = None,
) -> LoopState:
    """Run (or resume) the loop to ``config.rounds`` rounds; returns the final state.
    ``after_phase(round, phase)`` is called after each phase is recorded (for ``train``,
    from the training thread when collection runs ahead); ``on_round(point, round)`` once
    per round, when its curve line is written, with the line and the round's last training
    metrics (``train/...``): what ``--logger`` sends to TensorBoard and W&B."""
    from k8s_jobs.tasks import load_tasks
    from rl.trainer import read_policy_version

    out = config.out
    tasks = select_split(load_tasks(config.tasks), config.split)
    state = LoopState.read(out)
    if not (config.model / "config.json").is_file():
        raise LoopError(f"model {config.model} is not a model folder (no config.json)")
    for record in state.rounds:  # a stop between a round's state and its curve line
        if "train" in record.done:
            _append_curve(out, record, on_round)
    trainer = _Trainer(config, state, after_phase, on_round)
    vllm: Any = None
    try:
        for k in range(config.rounds):
            if k < len(state.rounds) and state.rounds[k].done == list(PHASES):
                continue
            if k == len(state.rounds):
                trainer.wait_for(k - 1 - config.max_staleness)
                policy = Path(trainer.newest_policy())
                record = RoundRecord(k, str(policy.resolve()), read_policy_version(policy))
                with trainer.lock:
                    state.rounds.append(record)
                    state.write(out)
            record = state.rounds[k]
            _say(f"round {k}: policy version {record.policy_version} ({record.policy})")
            for phase in ("collect", "snapshot"):
                if phase in record.done:
                    continue
                started = time.time()
                if phase == "collect":
                    if config.policy_server == "vllm":
                        vllm = _publish(config, vllm, record)
                    _collect(config, round_tasks(tasks, config, k), record, vllm)
                else:
                    _snapshot(config, record)
                _failpoint(phase, k)
                trainer.finished(record, phase, started)
            trainer.submit(k)
        trainer.wait_for(config.rounds - 1)
    finally:
        trainer.stop()
        if vllm is not None:
            vllm.stop()
    return state


class _Trainer:
    """The train phases, one after another in round order: inline in a synchronous loop,
    else in one background thread while the main thread collects. It owns the lock that
    guards the state (both threads record phases in it)."""

    def __init__(
        self,
        config: LoopConfig,
        state: LoopState,
        after_phase: Callable[[int, str], None] | None,
        on_round: Callable[[dict[str, Any], int], None] | None = None,
    ) -> None:
        self.config, self.state, self.after_phase = config, state, after_phase
        self.on_round = on_round
        self.lock = threading.Condition()
        self.queue: list[int] = []
        self.error: BaseException | None = None
        self.stopping = False
        self.thread: threading.Thread | None = None
        if config.max_staleness > 0:
            self.thread = threading.Thread(target=self._work, name="forge-loop-train", daemon=True)
            self.thread.start()

    def trained(self, k: int) -> bool:
        return k < len(self.state.rounds) and "train" in self.state.rounds[k].done

    def newest_policy(self) -> str:
        """The result of the last round trained, or the starting model."""
        with self.lock:
            k = len(self.state.rounds) - 1
            while k >= 0 and not self.trained(k):
                k -= 1
            return str(self.config.model) if k < 0 else self.state.rounds[k].result()

    def finished(self, record: RoundRecord, phase: str, started: float) -> None:
        with self.lock:
            record.times[phase] = [round(started, 3), round(time.time(), 3)]
            record.done.append(phase)
            self.state.write(self.config.out)
            if phase == "train":
                _append_curve(self.config.out, record, self.on_round)
            self.lock.notify_all()
        if self.after_phase is not None:
            self.after_phase(record.round, phase)

    def submit(self, k: int) -> None:
        if self.trained(k):
            return
        if self.thread is None:
            self._train(k)
            return
        with self.lock:
            self._raise()
            self.queue.append(k)
            self.lock.notify_all()

    def wait_for(self, k: int) -> None:
        """Block until rounds up to ``k`` have trained (a training failure is raised)."""
        with self.lock:
            while not all(self.trained(j) for j in range(k + 1)):
                self._raise()
                self.lock.wait(timeout=1.0)
            self._raise()

    def stop(self) -> None:
        """Drop trains not started; the one running (if any) dies with the process, and a
        resumed loop redoes it from its snapshot."""
        with self.lock:
            self.stopping = True
            self.queue.clear()
            self.lock.notify_all()

    def _raise(self) -> None:
        if self.error is not None:
            raise LoopError(f"training failed: {self.error}") from self.error

    def _work(self) -> None:
        while True:
            with self.lock:
                while not self.queue and not self.stopping:
                    self.lock.wait()
                if self.stopping:
                    return
                k = self.queue.pop(0)
            try:
                self._train(k)
            except BaseException as e:  # reported to the main thread at its next wait
                with self.lock:
                    self.error = e
                    self.lock.notify_all()
                return

    def _train(self, k: int) -> None:
        with self.lock:
            record = self.state.rounds[k]
            base = str(self.config.model) if k == 0 else self.state.rounds[k - 1].result()
        started = time.time()
        _train(self.config, record, base)
        self.finished(record, "train", started)


def select_split(tasks: list[Any], split: str | None) -> list[Any]:
    """The tasks of one split (``metadata.split``); all of them for None."""
    if split is None:
        return tasks
    chosen = [t for t in tasks if t.metadata.get("split") == split]
    if not chosen:
        splits = sorted({str(t.metadata.get("split")) for t in tasks})
        raise LoopError(f"no task has split {split!r} (splits: {', '.join(splits)})")
    return chosen


def round_tasks(tasks: list[Any], config: LoopConfig, k: int) -> list[Any]:
    """Round ``k``'s tasks: every task, or a sample that depends on the seed and ``k``
    only, so that a resumed round collects the same tasks."""
    if config.tasks_per_round is None or config.tasks_per_round >= len(tasks):
        return tasks
    return random.Random(f"{config.seed}:{k}").sample(tasks, config.tasks_per_round)


def serve_and_run(
    policy: Path,
    policy_version: int,
    tasks: list[Any],
    run_dir: Path,
    *,
    harness: str | None,
    n: int,
    parallel: int,
    serve_max_tokens: int = 0,
    timeout_s: float | None = None,
    confdir: Path | None = None,
    progress: bool = True,
    policy_url: str | None = None,
) -> Any:
    """Serve ``policy`` with the embedded policy server and run ``tasks`` x ``n`` against
    it in serve mode into ``run_dir`` (resumed if it holds a stopped run). Returns the
    rollout runner's ``RunSummary``. With ``policy_url``, a server already serving that
    policy (vLLM) answers instead; ``policy`` then gives the tokenizer only."""
    from k8s_jobs.local import RolloutOptions, run_rollouts
    from k8s_jobs.outcome import ProgressPrinter
    from mitm_addon.launch import DEFAULT_CONFDIR
    from mitm_addon.launch.serve_options import serve_options
    from rl.policy.server import PolicyServer, ServerSettings

    server = None
    if policy_url is None:
        server = PolicyServer(
            ServerSettings(model_dir=policy, port=0, policy_version=policy_version)
        ).start()
        policy_url = server.base_url
    printer = ProgressPrinter() if progress else None
    try:
        extra = serve_options(
            policy_url,
            policy,
            max_tokens=serve_max_tokens,
            policy_version=None if server is not None else policy_version,
        )
        return run_rollouts(
            tasks,
            RolloutOptions(
                out_dir=run_dir,
                harness=harness,
                n=n,
                parallel=parallel,
                policy_version=policy_version,
                timeout_s=timeout_s,
                confdir=confdir or DEFAULT_CONFDIR,
                proxy_extra=extra,
                resume=True,
                on_progress=printer,
            ),
        )
    finally:
        if printer is not None:
            printer.close()
        if server is not None:
            server.stop()


def _publish(config: LoopConfig, vllm: Any, record: RoundRecord) -> Any:
    """The loop's vLLM serving ``record.policy``: started with it on the first collect
    (or after a stop), else the checkpoint published into the running engine."""
    from rl.policy.vllm import VLLMError, VLLMServer

    policy = Path(record.policy)
    try:
        if vllm is None:
            _say(f"round {record.round}: starting vLLM with {policy}")
            return VLLMServer(
                policy,
                record.policy_version,
                config.out / "logs" / "vllm.log",
                python=config.vllm_python,
                extra_args=config.vllm_args,
            )
        if vllm.version != record.policy_version:
            seconds = vllm.publish(policy, record.policy_version)
            _say(
                f"round {record.round}: published {policy} into vLLM as policy version "
                f"{record.policy_version} in {seconds:.2f} s"
            )
    except VLLMError as e:
        raise LoopError(f"round {record.round}: {e}") from None
    return vllm


def _collect(config: LoopConfig, tasks: list[Any], record: RoundRecord, vllm: Any = None) -> None:
    run_dir = config.out / "runs" / f"round-{record.round}"
    started = time.monotonic()
    summary = serve_and_run(
        Path(record.policy),
        record.policy_version,
        tasks,
        run_dir,
        policy_url=None if vllm is None else vllm.base_url,
        harness=config.harness,
        n=config.n,
        parallel=config.parallel,
        serve_max_tokens=config.serve_max_tokens,
        timeout_s=config.timeout_s,
        confdir=config.confdir,
    )
    record.rollouts = len(summary.results)
    record.mean_reward = summary.mean_reward
    mean = "-" if summary.mean_reward is None else f"{summary.mean_reward:.3f}"
    _say(
        f"round {record.round}: {record.rollouts} rollouts in {time.monotonic() - started:.0f} s "
        f"into {run_dir}; mean reward {mean}"
    )


def _snapshot(config: LoopConfig, record: RoundRecord) -> None:
    from pipeline.grpo import parse_settings
    from pipeline.snapshot import read_manifest, write_snapshot

    run_dir = config.out / "runs" / f"round-{record.round}"
    snap = config.out / "snapshots" / f"round-{record.round}"
    if not snap.exists():  # else: written before a stop, and never rewritten
        settings = parse_settings(f"{k}={v}" for k, v in config.grpo.items())
        write_snapshot(run_dir, snap, group_settings=settings)
    record.samples = int(read_manifest(snap)["tables"]["samples"]["rows"])
    _say(f"round {record.round}: snapshot {snap} ({record.samples} samples)")


def _train(config: LoopConfig, record: RoundRecord, base: str) -> None:
    """Train round ``record.round``'s snapshot from ``base`` (the previous round's result)."""
    from rl.train import TrainError, TrainJob, settings_from, train

    snap = config.out / "snapshots" / f"round-{record.round}"
    ckpt = config.out / "checkpoints" / f"step-{record.round + 1}"
    record.trained_from = base
    if record.samples == 0:
        _say(f"round {record.round}: no samples to train on; the policy carries over")
        record.checkpoint = None
        return
    if not ckpt.exists():  # else: trained before a stop (renamed into place when whole)
        tmp = ckpt.parent / f".{ckpt.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)  # a checkpoint cut short
        settings, keep_optimizer = settings_from(config.train)
        job = TrainJob(
            model=Path(base),
            out=tmp,
            snapshot=snap,
            settings=settings,
            keep_optimizer=keep_optimizer,
            progress=False,
        )
        try:
            train(job, on_metrics=lambda line: print(line, flush=True))
        except TrainError as e:
            raise LoopError(f"round {record.round}: training failed: {e}") from None
        _failpoint("train", record.round)
        os.replace(tmp, ckpt)
        _failpoint("publish", record.round)
    record.checkpoint = str(ckpt.resolve())
    _say(f"round {record.round}: trained {ckpt}")


def _last_metrics(checkpoint: str | None) -> dict[str, Any]:
    """The last line of a checkpoint's ``train_metrics.jsonl`` ({} when nothing trained)."""
    if checkpoint is None:
        return {}
    metrics = Path(checkpoint) / "train_metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.is_file() else []
    return dict(json.loads(lines[-1])) if lines else {}


def _step_metrics(checkpoint: str | None) -> dict[str, float | None]:
    """What the round's training step did, from its checkpoint's ``train_metrics.jsonl``
    (the last step): its loss (policy gradient, or cross-entropy with ``sft``) and gradient
    norm; None when nothing was trained (then the weights did not move)."""
    last = _last_metrics(checkpoint)
    return {"loss": last.get("loss/pg", last.get("loss/sft")), "grad_norm": last.get("grad/norm")}


def _append_curve(
    out: Path,
    record: RoundRecord,
    on_round: Callable[[dict[str, Any], int], None] | None = None,
) -> None:
    """One line per finished round: the learning curve (mean reward by policy version),
    with what the round's step did (a grad_norm of 0 or None: the weights did not move).
    ``on_round`` gets the line and the step's last metrics line (keys ``train/...``)."""
    curve = out / CURVE_FILE
    seen = curve.read_text().splitlines() if curve.is_file() else []
    if any(json.loads(s)["round"] == record.round for s in seen):
        return  # written before a stop
    line = {
        "round": record.round,
        "policy_version": record.policy_version,
        "rollouts": record.rollouts,
        "mean_reward": record.mean_reward,
        "samples": record.samples,
        "trained": record.checkpoint is not None,
        **_step_metrics(record.checkpoint),
    }
    with open(curve, "a") as f:
        f.write(json.dumps(line) + "\n")
    if on_round is not None:
        last = _last_metrics(record.checkpoint)
        on_round({**line, **{f"train/{k}": v for k, v in last.items()}}, record.round)
