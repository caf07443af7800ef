"""``forge record --transparent``: capture a harness that ignores proxy variables.

The harness runs as its own user (``forge-harness``, created on first use, or ``--uid``);
an iptables rule in the ``nat`` table's OUTPUT chain REDIRECTs that user's outbound TCP
port 443 to the proxy, which runs as root in ``--mode transparent`` and reads the host
from the TLS SNI. This is how service meshes capture traffic (Istio's init container
does the same with ``--uid-owner``). The proxy's own connections to the providers are
root's, so they are not redirected back to it.

Besides the REDIRECT, the harness user's QUIC (UDP 443) is refused, so that HTTP/3
clients fall back to TCP, and its IPv6 port 443 (TCP and UDP) is refused, so that
clients fall back to IPv4 (the proxy listens on 127.0.0.1 only): nothing on port 443
leaves unrecorded. The rules are removed when the run ends, whatever ends it
(exception, Ctrl-C, SIGTERM, SIGHUP); only SIGKILL leaves them, and they carry the
comment ``forge-record pid N`` so that ``iptables-save | grep forge-record`` finds them.

Linux only, root only, Debian's ``iptables`` package (nft or legacy backend).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from mitm_addon.launch.errors import ForgeError
from mitm_addon.launch.proxy import RunningProxy

__all__ = [
    "HARNESS_HOME",
    "HARNESS_USER",
    "Harness",
    "HarnessUser",
    "Rule",
    "Tools",
    "add_argv",
    "capture_rules",
    "check_argv",
    "delete_argv",
    "ensure_harness_user",
    "find_tools",
    "harness_child_env",
    "prepare",
    "redirect_to_proxy",
    "resolve_harness_user",
    "run_as",
    "run_harness",
]

HARNESS_USER = "forge-harness"
HARNESS_HOME = Path("/var/lib/forge-harness")
CAPTURE_PORT = 443
RULE_COMMENT = "forge-record pid {pid}"
PROXY_VARIABLES = (
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
)
# Variables that point into root's home and would send the harness there.
ROOT_HOME_VARIABLES = (
    "XDG_RUNTIME_DIR",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "XDG_DATA_HOME",
    "XDG_STATE_HOME",
    "MAIL",
)
_SBIN = "/usr/local/sbin:/usr/sbin:/sbin"
_COMMAND_TIMEOUT_S = 30.0
_CHILD_STOP_S = 10.0
_XTABLES_WAIT_S = "10"
_INSTALL_HINT = "apt-get install iptables"

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- pure parts


@dataclass(frozen=True)
class Rule:
    """One iptables rule: ``BINARY -t TABLE {-I|-D|-C} CHAIN SPEC...``."""

    binary: str
    table: str
    chain: str
    spec: tuple[str, ...]

    def argv(self, action: str) -> list[str]:
        return [
            self.binary,
            "-w",
            _XTABLES_WAIT_S,
            "-t",
            self.table,
            action,
            self.chain,
            *self.spec,
        ]

    def __str__(self) -> str:
        return shlex.join(self.argv("-A"))


def capture_rules(
    uid: int,
    proxy_port: int,
    *,
    iptables: str = "iptables",
    ip6tables: str | None = "ip6tables",
    port: int = CAPTURE_PORT,
    comment: str | None = None,
) -> list[Rule]:
    """The rules that send ``uid``'s outbound ``port`` to the proxy and let nothing around it.

    IPv4: TCP ``port`` is REDIRECTed to ``proxy_port`` on 127.0.0.1; UDP ``port`` (QUIC)
    is rejected so HTTP/3 clients fall back to TCP. IPv6 (when ``ip6tables`` is given):
    TCP and UDP ``port`` are rejected, so clients fall back to IPv4. The REDIRECT comes
    first: once it is in, the harness's TLS traffic reaches the proxy.
    """
    if uid <= 0:
        raise ValueError(
            "the harness uid must not be root's: the proxy's own connections would loop"
        )
    if not 0 < proxy_port < 65536:
        raise ValueError(f"bad proxy port {proxy_port}")
    owner = ("-m", "owner", "--uid-owner", str(uid))
    tag = ("-m", "comment", "--comment", comment) if comment else ()

    def match(proto: str) -> tuple[str, ...]:
        return ("-p", proto, "-m", proto, "--dport", str(port), *owner, *tag)

    rules = [
        Rule(
            iptables,
            "nat",
            "OUTPUT",
            (*match("tcp"), "-j", "REDIRECT", "--to-ports", str(proxy_port)),
        ),
        Rule(iptables, "filter", "OUTPUT", (*match("udp"), "-j", "REJECT")),
    ]
    if ip6tables:
        rules += [
            Rule(
                ip6tables,
                "filter",
                "OUTPUT",
                (*match("tcp"), "-j", "REJECT", "--reject-with", "tcp-reset"),
            ),
            Rule(ip6tables, "filter", "OUTPUT", (*match("udp"), "-j", "REJECT")),
        ]
    return rules


def add_argv(rule: Rule) -> list[str]:
    """Insert at the head of the chain: an earlier ACCEPT or jump must not see the harness first."""
    return rule.argv("-I")


def delete_argv(rule: Rule) -> list[str]:
    return rule.argv("-D")


def check_argv(rule: Rule) -> list[str]:
    """Exit status 0 when the rule is in place."""
    return rule.argv("-C")


@dataclass(frozen=True)
class HarnessUser:
    uid: int
    gid: int
    name: str | None  # None: a bare --uid with no passwd entry
    home: Path | None  # a home from passwd that the user owns, else a per-run one is made
    groups: tuple[int, ...] = ()

    def describe(self) -> str:
        return f"{self.name} (uid {self.uid})" if self.name else f"uid {self.uid}"


def harness_child_env(
    env: dict[str, str], user: HarnessUser, home: Path, replace_paths: dict[str, str] | None = None
) -> dict[str, str]:
    """The harness's environment under transparent capture.

    Proxy variables go: capture does not need them, and a harness that honoured them would
    CONNECT to a proxy that speaks only transparent mode. CA variables stay (a harness that
    ignores proxies may still honour them), pointed at copies the harness user can read.
    HOME, USER and LOGNAME are the harness user's; XDG directories of root's go.
    """
    out = {
        k: v for k, v in env.items() if k not in PROXY_VARIABLES and k not in ROOT_HOME_VARIABLES
    }
    for name, value in list(out.items()):
        if replace_paths and value in replace_paths:
            out[name] = replace_paths[value]
    out["HOME"] = str(home)
    login = user.name or str(user.uid)
    out["USER"] = out["LOGNAME"] = login
    return out


# ---------------------------------------------------------------------------- preflight


@dataclass(frozen=True)
class Tools:
    iptables: str
    ip6tables: str | None  # None: IPv6 absent, or ip6tables not installed (a warning says so)


@dataclass(frozen=True)
class Harness:
    tools: Tools
    user: HarnessUser


def _which(name: str) -> str | None:
    path = os.environ.get("PATH", "")
    return shutil.which(name, path=f"{path}:{_SBIN}" if path else _SBIN)


def _ipv6_enabled() -> bool:
    return Path("/proc/net/if_inet6").exists()


def find_tools() -> Tools:
    iptables = _which("iptables")
    if iptables is None:
        raise ForgeError(
            f"forge record --transparent needs iptables, which is not installed: "
            f"{_INSTALL_HINT} (Debian/Ubuntu; the nft or legacy backend both work)"
        )
    ip6tables = _which("ip6tables")
    if ip6tables is None and _ipv6_enabled():
        log.warning(
            "warning: ip6tables not found: the harness's IPv6 traffic on port 443 is "
            "neither captured nor blocked (%s)",
            _INSTALL_HINT,
        )
    return Tools(iptables, ip6tables if _ipv6_enabled() else None)


def _check_root() -> None:
    if not sys.platform.startswith("linux"):
        raise ForgeError(
            "forge record --transparent works on Linux only (iptables); elsewhere run "
            "forge record without --transparent (harnesses that honour HTTPS_PROXY)"
        )
    if os.geteuid() != 0:
        raise ForgeError(
            "forge record --transparent needs root: it installs iptables rules and "
            "runs the harness as another user; run it with sudo, or use forge record "
            "without --transparent for harnesses that honour HTTPS_PROXY"
        )


def _home_of(entry: pwd.struct_passwd) -> Path | None:
    home = Path(entry.pw_dir)
    try:
        st = home.stat()
    except OSError:
        return None
    return home if home.is_dir() and st.st_uid == entry.pw_uid else None


def _user_from_passwd(entry: pwd.struct_passwd) -> HarnessUser:
    groups = tuple(g for g in os.getgrouplist(entry.pw_name, entry.pw_gid) if g != entry.pw_gid)
    return HarnessUser(entry.pw_uid, entry.pw_gid, entry.pw_name, _home_of(entry), groups)


def ensure_harness_user(name: str = HARNESS_USER, home: Path = HARNESS_HOME) -> HarnessUser:
    """The dedicated system user, created with ``useradd --system`` when missing."""
    try:
        return _user_from_passwd(pwd.getpwnam(name))
    except KeyError:
        pass
    useradd = _which("useradd")
    if useradd is None:
        raise ForgeError(
            f"cannot create the harness user {name!r}: useradd not found "
            "(apt-get install passwd), or pass --uid UID|USER"
        )
    shell = "/usr/sbin/nologin" if Path("/usr/sbin/nologin").exists() else "/bin/false"
    argv = [
        useradd,
        "--system",
        "--user-group",
        "--create-home",
        "--home-dir",
        str(home),
        "--shell",
        shell,
        "--comment",
        "Forge harness (forge record --transparent)",
        name,
    ]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=_COMMAND_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ForgeError(
            f"cannot create the harness user {name!r} ({shlex.join(argv)}): {e}"
        ) from e
    try:  # a concurrent run may have created it first
        return _user_from_passwd(pwd.getpwnam(name))
    except KeyError:
        raise ForgeError(
            f"cannot create the harness user {name!r} ({shlex.join(argv)}): "
            f"{done.stderr.strip() or f'exit {done.returncode}'}; or pass --uid UID|USER"
        ) from None


def resolve_harness_user(spec: str | None) -> HarnessUser:
    """``None``: forge-harness (created if missing); digits: that uid; else a user name."""
    if spec is None:
        user = ensure_harness_user()
    elif spec.strip().isdigit():
        uid = int(spec)
        try:
            user = _user_from_passwd(pwd.getpwuid(uid))
        except KeyError:
            user = HarnessUser(uid, uid, None, None)
    else:
        try:
            user = _user_from_passwd(pwd.getpwnam(spec))
        except KeyError:
            raise ForgeError(
                f"--uid {spec}: no such user (give a uid, a user name, or leave "
                f"--uid out to use {HARNESS_USER})"
            ) from None
    if user.uid == 0 or user.uid == os.geteuid():
        raise ForgeError(
            f"--uid {spec}: the harness must run as a user other than the proxy's "
            "(root): the rule redirects that user's traffic, and the proxy's own "
            "connections to the providers must not be redirected back to it"
        )
    return user


def prepare(uid_spec: str | None) -> Harness:
    """Everything checked before the proxy starts: Linux, root, iptables, the harness user."""
    _check_root()
    tools = find_tools()
    return Harness(tools, resolve_harness_user(uid_spec))


# ---------------------------------------------------------------------------- I/O


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    """Keep SIGINT/SIGTERM/SIGHUP pending while rules go in or out (never half done)."""
    sigs = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def _termination_raises() -> Iterator[None]:
    """SIGTERM and SIGHUP raise SystemExit (128 + signal), so that every ``finally`` runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _iptables(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S, stdin=subprocess.DEVNULL
    )


def _install(rule: Rule) -> None:
    argv = add_argv(rule)
    try:
        done = _iptables(argv)
    except FileNotFoundError as e:
        raise ForgeError(f"{rule.binary} not found: {_INSTALL_HINT}") from e
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ForgeError(f"cannot install the capture rule ({shlex.join(argv)}): {e}") from e
    if done.returncode != 0:
        raise ForgeError(
            f"cannot install the capture rule ({shlex.join(argv)}): "
            f"{done.stderr.strip() or f'exit {done.returncode}'}. It needs root with "
            "CAP_NET_ADMIN (in a container: --cap-add NET_ADMIN) and a kernel with iptables' nat "
            "table, REDIRECT, REJECT and the owner and comment matches (nf_tables or x_tables)"
        )


def _remove(rules: Sequence[Rule]) -> list[Rule]:
    """Delete each rule (newest first); those that could not be deleted."""
    left = []
    for rule in reversed(rules):
        try:
            ok = _iptables(delete_argv(rule)).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if not ok:
            left.append(rule)
    return left


@contextlib.contextmanager
def redirect_to_proxy(
    uid: int, proxy_port: int, tools: Tools | None = None
) -> Iterator[list[Rule]]:
    """Install the capture rules for ``uid``; always remove them on the way out."""
    tools = tools or find_tools()
    rules = capture_rules(
        uid,
        proxy_port,
        iptables=tools.iptables,
        ip6tables=tools.ip6tables,
        comment=RULE_COMMENT.format(pid=os.getpid()),
    )
    installed: list[Rule] = []
    try:
        with _signals_blocked():
            for rule in rules:
                _install(rule)
                installed.append(rule)
        yield installed
    finally:
        with _signals_blocked():
            left = _remove(installed)
        if left:
            log.warning(
                "warning: could not remove these iptables rules; remove them by hand:\n%s",
                "\n".join("  " + shlex.join(delete_argv(r)) for r in left),
            )


@contextlib.contextmanager
def _shared_dir(prefix: str, mode: int, owner: HarnessUser | None = None) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        os.chmod(path, mode)
        if owner is not None:
            os.chown(path, owner.uid, owner.gid)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def share_ca_files(env: dict[str, str], confdir: Path, dest: Path) -> dict[str, str]:
    """Copy the CA files that ``env`` points at (inside the root-only confdir) to ``dest``.

    Returns old path -> new path. Only certificates travel: a file holding a private key
    is refused, whatever its name.
    """
    confdir = confdir.resolve()
    mapping: dict[str, str] = {}
    for value in env.values():
        path = Path(value)
        if value in mapping or not path.is_absolute() or path.parent.resolve() != confdir:
            continue
        if not path.is_file():
            continue
        data = path.read_bytes()
        if b"PRIVATE KEY" in data:
            raise ForgeError(
                f"refusing to share {path} with the harness user: it holds a private key"
            )
        copy = dest / path.name
        copy.write_bytes(data)
        os.chmod(copy, 0o644)
        mapping[value] = str(copy)
    return mapping


def _probe_access(user: HarnessUser, cmd: Sequence[str], env: dict[str, str], cwd: str) -> None:
    """Fail early, and clearly, when the harness user cannot reach its cwd or its program."""
    exe = cmd[0] if "/" in cmd[0] else shutil.which(cmd[0], path=env.get("PATH"))
    if exe is None:
        raise ForgeError(f"cannot run {cmd[0]!r}: not found on PATH")
    paths = [exe]
    try:
        with open(exe, "rb") as f:
            head = f.read(256)
    except OSError:
        head = b""
    if head.startswith(b"#!"):
        parts = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
        if parts:
            paths.append(parts[0])
    script = 'cd -- "$1" 2>/dev/null || exit 3; shift; for f; do [ -x "$f" ] || { echo "$f"; exit 4; }; done'
    try:
        done = subprocess.run(
            ["/bin/sh", "-c", script, "sh", cwd, *paths],
            capture_output=True,
            text=True,
            timeout=_COMMAND_TIMEOUT_S,
            user=user.uid,
            group=user.gid,
            extra_groups=list(user.groups),
            env={"PATH": "/usr/bin:/bin"},
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return  # the probe itself failed: let the real start report
    who = f"the harness user {user.describe()}"
    if done.returncode == 3:
        raise ForgeError(
            f"{who} cannot enter the working directory {cwd}: run forge record from a "
            "directory it can reach, or let it in (chmod o+x on each parent)"
        )
    if done.returncode == 4:
        path = done.stdout.strip()
        real = os.path.realpath(path)
        shown = path if real == path else f"{path} (-> {real})"
        raise ForgeError(
            f"{who} cannot execute {shown}: every directory on the way must be "
            "searchable by it (a virtualenv made from an interpreter under /root is a "
            "common case); install the harness where that user can reach it, or pass "
            "--uid for a user that can"
        )


def run_as(cmd: Sequence[str], env: dict[str, str], user: HarnessUser) -> int:
    """Run ``cmd`` as ``user``; wait for it. Ctrl-C reaches it through the terminal.

    If the wait is interrupted (SIGTERM, an exception), the child is terminated first.
    """
    try:
        child = subprocess.Popen(
            list(cmd), env=env, user=user.uid, group=user.gid, extra_groups=list(user.groups)
        )
    except (FileNotFoundError, PermissionError) as e:
        raise ForgeError(f"cannot run {cmd[0]!r} as {user.describe()}: {e.strerror}") from e
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return child.wait()
    except BaseException:
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(_CHILD_STOP_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        raise
    finally:
        signal.signal(signal.SIGINT, previous)


def run_harness(
    cmd: Sequence[str], env: dict[str, str], proxy: RunningProxy, harness: Harness
) -> int:
    """The ``--transparent`` run: share the CA, redirect the user's port 443, run CMD as the user.

    ``env`` is ``harness_env``'s (CA variables included); ``proxy`` runs in transparent mode.
    Every step is undone on the way out, rules first.
    """
    user = harness.user
    with contextlib.ExitStack() as stack:
        stack.enter_context(_termination_raises())
        shared = stack.enter_context(_shared_dir("forge-ca-", 0o755))
        replace = share_ca_files(env, proxy.confdir, shared)
        home = user.home or stack.enter_context(_shared_dir("forge-home-", 0o700, owner=user))
        child_env = harness_child_env(env, user, home, replace)
        _probe_access(user, cmd, child_env, os.getcwd())
        stack.enter_context(redirect_to_proxy(user.uid, proxy.port, harness.tools))
        log.info(
            "transparent capture: %s runs as %s, its port %d redirected to the proxy",
            cmd[0],
            user.describe(),
            CAPTURE_PORT,
        )
        return run_as(cmd, child_env, user)
