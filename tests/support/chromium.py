"""Headless Chromium driven over the DevTools protocol, for tests that open real pages.

Debian's ``chromium`` is started with flags that keep it off the network (no background
networking, component updates or first-run tasks) in an empty profile, on a DevTools
port it picks itself (``--remote-debugging-port=0``; the port is read back from the
profile's ``DevToolsActivePort``). The protocol is spoken with ``websockets``.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

FLAGS = [
    "--headless",
    "--no-sandbox",  # root in CI: Chromium's sandbox refuses to run as root
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--no-default-browser-check",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]
NAMES = ("chromium", "chromium-browser")
START_TIMEOUT_S = 60.0  # 2 shared cores: a cold start has taken ~3 s, give it room
CALL_TIMEOUT_S = 60.0  # generous: CI and these machines share 2 cores with other work


def find_chromium() -> str | None:
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class ChromiumError(RuntimeError):
    pass


class Page:
    """One tab, attached with a flat session: commands, events and script errors."""

    def __init__(self, browser: Browser, target_id: str, session_id: str) -> None:
        self.browser = browser
        self.target_id = target_id
        self.session_id = session_id
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.send(method, params, self.session_id)

    def events(self, method: str) -> list[dict[str, Any]]:
        return [
            e["params"]
            for e in self.browser.events
            if e.get("sessionId") == self.session_id and e["method"] == method
        ]

    def navigate(self, url: str) -> None:
        before = len(self.events("Page.loadEventFired"))
        self.send("Page.navigate", {"url": url})
        self.browser.wait_for(
            lambda: len(self.events("Page.loadEventFired")) > before, f"the load of {url}"
        )

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (promises awaited), or ChromiumError."""
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise ChromiumError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_until(self, expression: str, what: str, timeout_s: float = CALL_TIMEOUT_S) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.05)
        raise ChromiumError(f"timed out after {timeout_s:.0f} s waiting for {what}")

    def script_errors(self) -> list[str]:
        """Uncaught exceptions, console errors and error log entries (CSP violations,
        failed loads) seen so far."""
        out = [
            json.dumps(e["exceptionDetails"], sort_keys=True)
            for e in self.events("Runtime.exceptionThrown")
        ]
        out += [
            " ".join(str(a.get("value", a.get("description", ""))) for a in e["args"])
            for e in self.events("Runtime.consoleAPICalled")
            if e["type"] in ("error", "assert")
        ]
        out += [
            f"{e['entry'].get('source')}: {e['entry'].get('text')}"
            for e in self.events("Log.entryAdded")
            if e["entry"].get("level") == "error"
        ]
        return out

    def close(self) -> None:
        self.browser.send("Target.closeTarget", {"targetId": self.target_id})

    def screenshot(self, path: Path, width: int = 1280) -> Path:
        """A PNG of the whole page (beyond the viewport) at ``width`` CSS pixels."""
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
        )
        shot = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


class Browser:
    """A Chromium process and its DevTools connection."""

    def __init__(self, proc: subprocess.Popen[bytes], ws: ClientConnection, log: Path) -> None:
        self.proc = proc
        self.ws = ws
        self.log = log
        self.events: list[dict[str, Any]] = []
        self._ids = itertools.count(1)

    def _read(self, timeout_s: float) -> dict[str, Any]:
        try:
            message: dict[str, Any] = json.loads(self.ws.recv(timeout=timeout_s))
        except TimeoutError:
            raise ChromiumError(
                f"no DevTools message in {timeout_s:.0f} s; {self.tail()}"
            ) from None
        return message

    def send(
        self, method: str, params: dict[str, Any] | None = None, session_id: str | None = None
    ) -> dict[str, Any]:
        msg_id = next(self._ids)
        message: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session_id:
            message["sessionId"] = session_id
        self.ws.send(json.dumps(message))
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while True:
            reply = self._read(max(0.1, deadline - time.monotonic()))
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise ChromiumError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            if "method" in reply:
                self.events.append(reply)

    def wait_for(self, done: Any, what: str, timeout_s: float = CALL_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChromiumError(f"timed out waiting for {what}; {self.tail()}")
            with contextlib.suppress(ChromiumError):
                reply = self._read(min(left, 1.0))
                if "method" in reply:
                    self.events.append(reply)

    def new_page(self) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})
        return Page(self, target, session["sessionId"])

    def tail(self) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "chromium log tail:\n" + "\n".join(text.splitlines()[-15:])


def _devtools_url(profile: Path, proc: subprocess.Popen[bytes], log: Path) -> str:
    """ws:// URL of the browser, from the profile's DevToolsActivePort (port, then path)."""
    active = profile / "DevToolsActivePort"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ChromiumError(f"chromium exited with {proc.returncode}; see {log}")
        lines = active.read_text().splitlines() if active.exists() else []
        if len(lines) >= 2:
            return f"ws://127.0.0.1:{int(lines[0])}{lines[1]}"
        time.sleep(0.05)
    raise ChromiumError(f"chromium wrote no {active} in {START_TIMEOUT_S:.0f} s; see {log}")


@contextlib.contextmanager
def chromium(workdir: Path, executable: str | None = None) -> Iterator[Browser]:
    """A headless Chromium with an empty profile under ``workdir``, closed on exit."""
    exe = executable or find_chromium()
    if exe is None:
        raise ChromiumError("no chromium on PATH (Debian: apt-get install chromium)")
    profile = workdir / "chromium-profile"
    profile.mkdir(parents=True)
    log = workdir / "chromium.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: its helpers end with it
        )
    try:
        url = _devtools_url(profile, proc, log)
        with connect(url, max_size=None, open_timeout=CALL_TIMEOUT_S) as ws:
            browser = Browser(proc, ws, log)
            yield browser
            with contextlib.suppress(Exception):
                browser.send("Browser.close")
        proc.wait(timeout=15)
    finally:
        # Our group only (its id is the browser's pid): the browser if it hung, and any
        # helper process it left behind.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=15)
