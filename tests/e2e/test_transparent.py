"""``forge record --transparent``: a harness that ignores proxy variables is still recorded.

Each module run creates its own network namespace (``ip netns``), with
``/etc/netns/NAME/hosts`` mapping api.openai.com to 127.0.0.2 (``ip netns exec``
bind-mounts it over /etc/hosts; there is no DNS here). Inside it run the scripted
upstream and ``forge record --transparent``, whose iptables rules therefore live and
die with the namespace: the host's tables are never touched. Nothing listens on
127.0.0.2:443, so a call that arrives is one the REDIRECT delivered to the proxy.

Needs root, ``ip`` (iproute2) and ``iptables``; CI installs both with apt.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from mitm_addon.launch import ForgeError, system_ca_file, transparent
from tests.support.forge_proxy import (
    ANTHROPIC_KEY,
    COOKIE_VALUE,
    OPENAI_KEY,
    SECRETS,
    files_containing,
)

pytestmark = [pytest.mark.slow, pytest.mark.root]

REPO = Path(__file__).resolve().parents[2]
SBIN_PATH = f"{os.environ.get('PATH', '')}:/usr/local/sbin:/usr/sbin:/sbin"
UPSTREAM_TEXT = "Hello from the scripted upstream."
RUN_TIMEOUT_S = 120
STEP_TIMEOUT_S = 30


def _which(name: str) -> str | None:
    return shutil.which(name, path=SBIN_PATH)


def _skip_reason() -> str | None:
    if not sys.platform.startswith("linux"):
        return "transparent capture is Linux only"
    if os.geteuid() != 0:
        return "needs root (network namespaces, iptables, a harness user): run as root, as CI does"
    missing = [tool for tool in ("ip", "iptables") if _which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed: apt-get install iproute2 iptables"
    return None


_SKIP = _skip_reason()
if _SKIP:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))


# --------------------------------------------------------------------------- harnesses

# Standard library only, so any Python the harness user can run will do. http.client never
# looks at proxy variables: the harness dials api.openai.com:443 itself.
STDLIB_HARNESS = r"""
import http.client, json, os, ssl, sys

ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
def call(stream):
    conn = http.client.HTTPSConnection("api.openai.com", 443, context=ctx, timeout=30)
    body = {"model": "gpt-4o-mini", "stream": stream,
            "messages": [{"role": "user", "content": "Say hello."}]}
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                 headers={"content-type": "application/json",
                          "authorization": "Bearer OPENAI_KEY",
                          "x-api-key": "ANTHROPIC_KEY",
                          "cookie": "session=COOKIE_VALUE"})
    resp = conn.getresponse()
    data = resp.read().decode()
    conn.close()
    if resp.status != 200:
        sys.exit(f"HTTP {resp.status}: {data[:300]}")
    return data

plain = json.loads(call(False))["choices"][0]["message"]["content"]
events = [line for line in call(True).splitlines() if line.startswith("data:")]
probe = os.path.join(os.environ["HOME"], ".forge-transparent-probe")
with open(probe, "w") as f:
    f.write("ok")
os.unlink(probe)
print(json.dumps({"uid": os.getuid(), "pid": os.getpid(), "home": os.environ["HOME"],
                  "text": plain, "events": len(events),
                  "proxy_vars": sorted(k for k in os.environ if k.lower().endswith("_proxy")
                                       and k.lower() != "no_proxy")}))
"""

# The official SDK with proxies off (trust_env=False) and the CA bundle from the environment.
SDK_HARNESS = r"""
import json, os
import httpx, openai

http = httpx.Client(trust_env=False, verify=os.environ["SSL_CERT_FILE"], timeout=30)
client = openai.OpenAI(api_key="OPENAI_KEY", base_url="https://api.openai.com/v1",
                       http_client=http, max_retries=0,
                       default_headers={"x-api-key": "ANTHROPIC_KEY",
                                        "cookie": "session=COOKIE_VALUE"})
reply = client.chat.completions.create(
    model="gpt-4o-mini", messages=[{"role": "user", "content": "Say hello."}])
chunks = list(client.chat.completions.create(
    model="gpt-4o-mini", messages=[{"role": "user", "content": "Say hello."}], stream=True))
http.close()
print(json.dumps({"uid": os.getuid(), "pid": os.getpid(), "home": os.environ["HOME"],
                  "text": reply.choices[0].message.content, "events": len(chunks)}))
"""

SLEEPER = "import time; print('ready', flush=True); time.sleep(90)"


# --------------------------------------------------------------------------- fixtures


def _run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    kw.setdefault("timeout", STEP_TIMEOUT_S)
    return subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, **kw)


def _in_ns(ns: str, *argv: str) -> list[str]:
    return [_which("ip") or "ip", "netns", "exec", ns, *argv]


@pytest.fixture(scope="module")
def netns() -> Iterator[str]:
    name = f"forge-t-{os.getpid()}-{secrets.token_hex(3)}"
    etc = Path("/etc/netns") / name
    try:
        done = _run([_which("ip") or "ip", "netns", "add", name])
        assert done.returncode == 0, f"ip netns add failed: {done.stderr}"
        etc.mkdir(parents=True)
        (etc / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n127.0.0.2 api.openai.com\n")
        done = _run(_in_ns(name, "ip", "link", "set", "lo", "up"))
        assert done.returncode == 0, done.stderr
        yield name
    finally:
        pids = _run([_which("ip") or "ip", "netns", "pids", name]).stdout.split()
        for pid in pids:  # only what this module started lives in its namespace
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _run([_which("ip") or "ip", "netns", "del", name])
        shutil.rmtree(etc, ignore_errors=True)


@pytest.fixture(scope="module")
def shared_dir() -> Iterator[Path]:
    """A directory the harness user can read (pytest's tmp_path is root's only)."""
    path = Path(tempfile.mkdtemp(prefix="forge-transparent-test-"))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _with_secrets(source: str) -> str:
    """A harness script that sends the dummy key, cookie and x-api-key the scan looks for."""
    return (
        source.replace("OPENAI_KEY", OPENAI_KEY)
        .replace("ANTHROPIC_KEY", ANTHROPIC_KEY)
        .replace("COOKIE_VALUE", COOKIE_VALUE)
    )


def _write_shared(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    os.chmod(path, 0o644)
    return path


def _read_line(stream: Any, timeout: float) -> str:
    sel = selectors.DefaultSelector()
    sel.register(stream, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            return ""
        return str(stream.readline())
    finally:
        sel.close()


@pytest.fixture(scope="module")
def upstream_port(netns: str, shared_dir: Path) -> Iterator[int]:
    script = _write_shared(shared_dir, "script.json", json.dumps([{"text": UPSTREAM_TEXT}]))
    proc = subprocess.Popen(
        _in_ns(
            netns,
            sys.executable,
            "-m",
            "tests.support.upstream",
            "--port",
            "0",
            "--script",
            str(script),
            "--max-seconds",
            "900",
        ),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        line = _read_line(proc.stdout, STEP_TIMEOUT_S)
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert match, f"the scripted upstream did not start: {line!r}"
        yield int(match.group(1))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


@pytest.fixture(scope="module")
def harness_user() -> transparent.HarnessUser:
    return transparent.ensure_harness_user()


def _runs_as(
    user: transparent.HarnessUser, argv: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    try:
        return _run(
            argv,
            user=user.uid,
            group=user.gid,
            extra_groups=list(user.groups),
            env={"PATH": "/usr/bin:/bin", **(env or {})},
            cwd="/",
        )
    except OSError as e:  # the program itself is out of the user's reach
        return subprocess.CompletedProcess(argv, 126, "", f"{argv[0]}: {e}")


@pytest.fixture(scope="module")
def harness_python(harness_user: transparent.HarnessUser) -> str:
    """A Python the harness user can execute (a venv under /root is out of its reach)."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if (
            Path(candidate).exists()
            and _runs_as(harness_user, [candidate, "-c", "pass"]).returncode == 0
        ):
            return candidate
    pytest.skip(f"no Python that {harness_user.describe()} can execute")


def _python_that_runs(user: transparent.HarnessUser, probe: str, what: str) -> list[str]:
    """``[python, ...]`` that runs ``probe`` as ``user`` with the venv's packages and this
    repository importable, or a skip saying why not (a venv under /root is out of reach)."""
    candidates: list[list[str]] = [["env", f"PYTHONPATH={REPO}", sys.executable]]
    if sys.version_info[:2] == (3, 11):  # the venv's packages on a system Python of its version
        site = sysconfig.get_paths()["purelib"]
        candidates.append(["env", f"PYTHONPATH={site}:{REPO}", "/usr/bin/python3"])
    reasons = []
    for prefix in candidates:
        done = _runs_as(user, [*prefix, "-c", probe])
        if done.returncode == 0:
            return prefix
        tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        reasons.append(f"{' '.join(prefix)}: {tail}")
    pytest.skip(f"{what} does not run as {user.describe()}: " + "; ".join(reasons))


@pytest.fixture(scope="module")
def sdk_command(harness_user: transparent.HarnessUser) -> list[str]:
    """``[python, ...]`` running the openai SDK as the harness user."""
    probe = (
        "import httpx, openai; openai.OpenAI(api_key='x', "
        "http_client=httpx.Client(trust_env=False))"
    )
    return _python_that_runs(harness_user, probe, "the openai SDK")


@pytest.fixture(scope="module")
def forge_command(harness_user: transparent.HarnessUser) -> list[str]:
    """``[python, ...]`` that imports Forge's CLI as the harness user."""
    return _python_that_runs(harness_user, "import forge_cli.main", "forge_cli")


@pytest.fixture(scope="module")
def confdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("forge-conf")


def _record_argv(
    ns: str, port: int, out: Path, confdir: Path, cmd: list[str], *extra: str
) -> list[str]:
    # As in a container with the default capabilities: root, but no CAP_SYS_PTRACE, so the
    # kernel hides the harness user's descriptors from the proxy unless it reads them as
    # that user.
    no_ptrace = [setpriv, "--bounding-set=-sys_ptrace"] if (setpriv := _which("setpriv")) else []
    return _in_ns(
        ns,
        *no_ptrace,
        sys.executable,
        "-m",
        "forge_cli.main",
        "record",
        "--transparent",
        *extra,
        "--upstream",
        f"api.openai.com=http://127.0.0.1:{port}",
        "--out",
        str(out),
        "--confdir",
        str(confdir),
        "--",
        *cmd,
    )


def _record_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env["HTTPS_PROXY"] = env["https_proxy"] = "http://127.0.0.1:9"  # must not reach the harness
    return env


def _capture_rules(ns: str) -> list[str]:
    """Rules of any forge run left in the namespace's tables."""
    left = []
    tools = [("iptables", "nat"), ("iptables", "filter")]
    if _which("ip6tables"):
        tools += [("ip6tables", "nat"), ("ip6tables", "filter")]
    for tool, table in tools:
        done = _run(_in_ns(ns, tool, "-w", "10", "-t", table, "-S"))
        assert done.returncode == 0, f"{tool} -t {table} -S: {done.stderr}"
        left += [
            line
            for line in done.stdout.splitlines()
            if "forge-record" in line or "--uid-owner" in line
        ]
    return left


def _calls(out: Path) -> list[dict[str, object]]:
    from pipeline.store import connect

    con = connect(out)
    cur = con.execute(
        "SELECT host, status, status_code, api, stream, upstream_url, pid, "
        "process_name, rollout_id FROM calls ORDER BY started_at"
    )
    names = [d[0] for d in cur.description]
    rows = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    con.close()
    return rows


def _check_recorded(
    done: subprocess.CompletedProcess[str], out: Path, port: int, user: transparent.HarnessUser
) -> dict[str, object]:
    assert done.returncode == 0, f"forge record failed:\n{done.stdout}\n{done.stderr}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["uid"] == user.uid, report
    assert report["text"] == UPSTREAM_TEXT
    assert report["events"] >= 2
    assert "recorded 2 LLM call(s)" in done.stderr, done.stderr
    calls = _calls(out)
    assert len(calls) == 2, calls
    for call in calls:
        assert call["host"] == "api.openai.com"
        assert call["status"] == "complete"
        assert call["status_code"] == 200
        assert call["api"] == "openai_chat"
        assert call["upstream_url"] == f"http://127.0.0.1:{port}"
        assert call["rollout_id"] == out.name
        assert call["pid"] == report["pid"], (call, report)  # attribution works across uids
    assert [c["stream"] for c in calls] == [False, True]
    assert files_containing(out, SECRETS) == [], "a key or cookie the harness sent reached disk"
    return report


# --------------------------------------------------------------------------- tests


def test_rule_argv() -> None:
    rules = transparent.capture_rules(999, 41234, comment="forge-record pid 7")
    assert transparent.add_argv(rules[0]) == [
        "iptables",
        "-w",
        "10",
        "-t",
        "nat",
        "-I",
        "OUTPUT",
        "-p",
        "tcp",
        "-m",
        "tcp",
        "--dport",
        "443",
        "-m",
        "owner",
        "--uid-owner",
        "999",
        "-m",
        "comment",
        "--comment",
        "forge-record pid 7",
        "-j",
        "REDIRECT",
        "--to-ports",
        "41234",
    ]
    assert transparent.delete_argv(rules[0])[5] == "-D"
    assert [(r.binary, r.table, r.spec[1]) for r in rules] == [
        ("iptables", "nat", "tcp"),
        ("iptables", "filter", "udp"),
        ("ip6tables", "filter", "tcp"),
        ("ip6tables", "filter", "udp"),
    ]
    assert len(transparent.capture_rules(999, 41234, ip6tables=None)) == 2
    with pytest.raises(ValueError):
        transparent.capture_rules(0, 41234)


def test_clear_errors(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from forge_cli.main import main

    monkeypatch.setattr(transparent, "_which", lambda name: None)
    with pytest.raises(ForgeError, match="apt-get install iptables"):
        transparent.find_tools()
    monkeypatch.undo()
    assert main(["record", "--uid", "nobody", "--", "true"]) == 2
    assert "--uid goes with --transparent" in capsys.readouterr().err
    assert main(["record", "--transparent", "--uid", "0", "--", "true"]) == 2
    assert "other than the proxy's" in capsys.readouterr().err
    assert main(["record", "--transparent", "--uid", "no-such-user-forge", "--", "true"]) == 2
    assert "no such user" in capsys.readouterr().err


def test_refuses_without_root(
    harness_user: transparent.HarnessUser, forge_command: list[str]
) -> None:
    done = _runs_as(
        harness_user,
        [*forge_command, "-m", "forge_cli.main", "record", "--transparent", "--", "true"],
    )
    assert done.returncode == 2, done.stderr
    assert "needs root" in done.stderr


def test_records_harness_that_ignores_proxy_variables(
    netns: str,
    upstream_port: int,
    shared_dir: Path,
    harness_user: transparent.HarnessUser,
    harness_python: str,
    confdir: Path,
    tmp_path: Path,
) -> None:
    script = _write_shared(shared_dir, "stdlib_harness.py", _with_secrets(STDLIB_HARNESS))
    setpriv = _which("setpriv")
    if setpriv:  # without forge, nothing answers on api.openai.com:443 in the namespace
        alone = _run(
            _in_ns(
                netns,
                setpriv,
                f"--reuid={harness_user.uid}",
                f"--regid={harness_user.gid}",
                "--clear-groups",
                harness_python,
                str(script),
            ),
            env={"PATH": "/usr/bin:/bin", "SSL_CERT_FILE": str(system_ca_file()), "HOME": "/tmp"},
        )
        assert alone.returncode != 0 and "refused" in alone.stderr.lower(), alone.stderr

    out = tmp_path / "run-stdlib"
    done = _run(
        _record_argv(netns, upstream_port, out, confdir, [harness_python, str(script)]),
        cwd=shared_dir,
        env=_record_env(),
        timeout=RUN_TIMEOUT_S,
    )
    report = _check_recorded(done, out, upstream_port, harness_user)
    assert report["proxy_vars"] == []  # transparent mode hands the harness no proxy
    assert report["home"] == str(harness_user.home or report["home"])
    assert "transparent capture" in done.stderr
    assert _capture_rules(netns) == []
    assert "Transparent Proxy listening" in (out / "proxy.log").read_text()


def test_records_openai_sdk_with_trust_env_off(
    netns: str,
    upstream_port: int,
    shared_dir: Path,
    harness_user: transparent.HarnessUser,
    sdk_command: list[str],
    confdir: Path,
    tmp_path: Path,
) -> None:
    script = _write_shared(shared_dir, "sdk_harness.py", _with_secrets(SDK_HARNESS))
    out = tmp_path / "run-sdk"
    done = _run(
        _record_argv(netns, upstream_port, out, confdir, [*sdk_command, str(script)]),
        cwd=shared_dir,
        env=_record_env(),
        timeout=RUN_TIMEOUT_S,
    )
    _check_recorded(done, out, upstream_port, harness_user)
    assert _capture_rules(netns) == []


def test_rules_removed_when_forge_is_terminated(
    netns: str,
    upstream_port: int,
    shared_dir: Path,
    harness_python: str,
    confdir: Path,
    tmp_path: Path,
) -> None:
    # A bare uid with no usable home: forge makes a per-run HOME and removes it.
    nobody = transparent.resolve_harness_user("nobody")
    assert nobody.home is None
    out = tmp_path / "run-term"
    before = set(Path(tempfile.gettempdir()).glob("forge-home-*"))
    proc = subprocess.Popen(
        _record_argv(
            netns, upstream_port, out, confdir, [harness_python, "-c", SLEEPER], "--uid", "nobody"
        ),
        cwd=shared_dir,
        env=_record_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = _read_line(proc.stdout, RUN_TIMEOUT_S)
        assert line.strip() == "ready", line
        assert len(_capture_rules(netns)) >= 2  # in place while the harness runs
        forge = psutil.Process(proc.pid)
        family = forge.children(recursive=True)
        homes = [
            p
            for p in set(Path(tempfile.gettempdir()).glob("forge-home-*")) - before
            if p.stat().st_uid == nobody.uid
        ]
        assert len(homes) == 1, homes
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert _capture_rules(netns) == []
    gone, alive = psutil.wait_procs(family, timeout=15)
    assert not alive, f"left running: {alive}"  # the harness and the proxy stopped
    assert not any(h.exists() for h in homes)
    assert not list(Path(tempfile.gettempdir()).glob(f"forge-ca-*{os.sep}mitmproxy-ca-cert.pem"))


def test_rules_always_come_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Install failures and interrupts leave no rule behind (iptables faked: no table touched)."""
    log: list[list[str]] = []
    fail_on = {"filter": 0}

    def fake(argv: list[str]) -> subprocess.CompletedProcess[str]:
        log.append(argv)
        bad = argv[5] == "-I" and argv[4] == "filter" and fail_on["filter"]
        return subprocess.CompletedProcess(argv, 1 if bad else 0, "", "Permission denied" if bad else "")

    monkeypatch.setattr(transparent, "_iptables", fake)
    tools = transparent.Tools("iptables", "ip6tables")
    with pytest.raises(KeyboardInterrupt), transparent.redirect_to_proxy(999, 4000, tools) as rules:
        assert len(rules) == 4
        raise KeyboardInterrupt
    assert [a[5] for a in log] == ["-I"] * 4 + ["-D"] * 4
    assert [a[6:] for a in log[4:]] == [a[6:] for a in reversed(log[:4])]

    log.clear()
    fail_on["filter"] = 1
    with pytest.raises(ForgeError, match="Permission denied.*CAP_NET_ADMIN"), \
            transparent.redirect_to_proxy(999, 4000, tools):
        pytest.fail("the body must not run when a rule cannot go in")
    assert [(a[4], a[5]) for a in log] == [("nat", "-I"), ("filter", "-I"), ("nat", "-D")]
