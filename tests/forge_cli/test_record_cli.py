"""``forge record -- CMD``: the harness runs unmodified, every call recorded, CMD's exit code kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pipeline.store import connect
from tests.support.forge_proxy import OPENAI_KEY, SECRETS, files_containing
from tests.support.upstream import ScriptedUpstream

# The toy harness is asked to consult a helper process, then to write a file, then it is done.
SCRIPT = [
    {"tool_call": {"name": "consult", "arguments": {"question": "Which file name?"}}},
    {"tool_call": {"name": "shell", "arguments": {"command": "echo hi > hello.txt"}}},
    {"text": "Done."},
]


def forge_record(
    tmp_path: Path, confdir: Path, upstream: ScriptedUpstream, *cmd: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["OPENAI_API_KEY"] = OPENAI_KEY
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "forge_cli.main",
            "record",
            "--out",
            str(tmp_path / "run"),
            "--confdir",
            str(confdir),
            "--upstream",
            f"api.openai.com={upstream.base_url}",
            "--",
            *cmd,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_record_runs_the_toy_harness_and_records_both_of_its_processes(
    tmp_path: Path, confdir: Path
) -> None:
    with ScriptedUpstream(SCRIPT, side_text="Call it hello.txt.") as up:
        done = forge_record(
            tmp_path, confdir, up, sys.executable, "-m", "k8s_jobs.toy_harness", "make hello.txt"
        )
        received = [r for r in up.received if r.api == "openai_chat"]
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "hello.txt").read_text() == "hi\n"
    assert "recorded 4 LLM call(s)" in done.stderr and "openai_chat" in done.stderr
    rows = (
        connect(tmp_path / "run")
        .execute(
            "SELECT pid, parent_pids, process_name, rollout_id, status, tools FROM calls ORDER BY call_id"
        )
        .fetchall()
    )
    assert len(rows) == len(received) == 4
    assert {r[3] for r in rows} == {"run"} and {r[4] for r in rows} == {"complete"}
    agent_pids = {r[0] for r in rows if r[5]}
    (consult,) = [r for r in rows if not r[5]]  # the helper process offers no tools
    assert len(agent_pids) == 1 and consult[0] not in agent_pids
    assert agent_pids <= set(consult[1]), "the consulting process descends from the agent"
    assert files_containing(tmp_path / "run", SECRETS) == []


def test_record_exits_with_the_commands_code(tmp_path: Path, confdir: Path) -> None:
    with ScriptedUpstream([{"text": "hi"}]) as up:
        done = forge_record(tmp_path, confdir, up, "bash", "-c", "exit 7")
    assert done.returncode == 7
    assert "recorded 0 LLM call(s)" in done.stderr


def test_record_without_a_command_says_how_to_call_it(tmp_path: Path, confdir: Path) -> None:
    with ScriptedUpstream([{"text": "hi"}]) as up:
        done = forge_record(tmp_path, confdir, up)
    assert done.returncode == 2 and "forge record [OPTIONS] -- CMD" in done.stderr


def test_a_run_directory_that_cannot_be_made_is_a_one_line_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "forge_cli.main", "record", "--out", "/proc/x", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "forge: error: cannot create the run directory /proc/x: No such file or directory"
    ]


def test_record_writes_the_rollouts_row(tmp_path: Path, confdir: Path) -> None:
    with ScriptedUpstream([{"text": "hi"}]) as up:
        done = forge_record(tmp_path, confdir, up, "bash", "-c", "exit 3")
    assert done.returncode == 3
    (row,) = (
        connect(tmp_path / "run")
        .execute("SELECT rollout_id, harness, status, exit_code, command FROM rollouts")
        .fetchall()
    )
    assert row == ("run", "bash", "crashed", 3, ["bash", "-c", "exit 3"])


def test_a_sigkilled_launcher_takes_its_proxy_along_and_its_calls_are_stored(
    tmp_path: Path, confdir: Path
) -> None:
    """The proxy runs in its own session, out of reach of a signal to the launcher's
    group; it notices its parent has gone, stores what it recorded, and exits."""
    import signal
    import time

    import psutil

    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["OPENAI_API_KEY"] = OPENAI_KEY
    run = tmp_path / "run"
    with ScriptedUpstream([{"text": "hi"}]) as up:
        ask = f"{sys.executable} -m k8s_jobs.toy_harness 'say hi' && touch {tmp_path / 'asked'} && sleep 60"
        launcher = subprocess.Popen(
            [sys.executable, "-m", "forge_cli.main", "record", "--out", str(run),
             "--confdir", str(confdir), "--upstream", f"api.openai.com={up.base_url}",
             "--", "bash", "-c", ask],
            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not (tmp_path / "asked").exists():
                assert time.monotonic() < deadline and launcher.poll() is None
                time.sleep(0.2)
            (proxy,) = [
                p
                for p in psutil.Process(launcher.pid).children()
                if any("mitmdump" in part for part in p.cmdline())
            ]
            launcher.send_signal(signal.SIGKILL)
            launcher.wait()
            proxy.wait(timeout=20)  # psutil.TimeoutExpired if it outlived its launcher
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()
    # Its one call is in a shard (not left in the write-ahead log for a later run).
    assert connect(run).execute("SELECT count(*) FROM calls").fetchone() == (1,)
    assert not [p for p in (run / "wal").glob("*.wal") if p.stat().st_size]


def test_a_proxy_whose_launcher_died_while_it_started_stops_by_itself(
    tmp_path: Path, confdir: Path
) -> None:
    """The launcher is SIGKILLed before the proxy's addon is up (a loop killed right after
    it started a round's proxy): the proxy, reparented before it could watch its launcher,
    stops instead of holding the run directory for ever."""
    import psutil

    from mitm_addon.launch.proxy import ADDON, mitmdump_path

    start = (
        "import os, subprocess, sys\n"
        "p = subprocess.Popen([sys.argv[1], '--listen-host', '127.0.0.1', '--listen-port', '0',"
        " '-s', sys.argv[2], '--set', 'confdir=' + sys.argv[3], '--set', 'forge_dir=' + sys.argv[4],"
        " '--set', f'forge_parent_pid={os.getpid()}'], start_new_session=True,"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(p.pid, flush=True)\n"
        "os._exit(0)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", start, mitmdump_path(), str(ADDON), str(confdir), str(tmp_path / "run")],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    proxy = psutil.Process(int(out.stdout))
    try:
        proxy.wait(timeout=60)  # psutil.TimeoutExpired if it outlived its launcher
    finally:
        if proxy.is_running():
            proxy.kill()
