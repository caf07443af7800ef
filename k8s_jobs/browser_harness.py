"""A GUI harness: the browser-use agent, as it ships, on one browser task.

    .harnesses/browser-use/venv/bin/python k8s_jobs/browser_harness.py \\
        --task "Fill the sign-up form with the name Ada and submit it." \\
        --url http://127.0.0.1:8000/form.html --result result.json

Runs ``browser_use.Agent`` with its OpenAI chat model (``browser_use.llm.ChatOpenAI``,
api.openai.com unless ``OPENAI_BASE_URL`` says otherwise) driving Debian's headless
``chromium`` (``--chromium``; no browser is downloaded). Under ``forge record`` or a
rollout, the model's calls go through Forge's proxy (``HTTPS_PROXY``, CA trust through
``SSL_CERT_FILE``); the browser is told to use no proxy (``--no-proxy-server``), so the
pages it opens and its own background traffic never reach the proxy, and its DevTools
socket on loopback is covered by ``NO_PROXY``.

The agent sees a screenshot of the page at every step (``use_vision``) and answers with
its JSON actions (click, input, navigate, scroll, done, ...). Its own judge call after
the run is off (``use_judge=False``): a verifier outside the harness decides the reward.
Telemetry, cloud sync, the version check and the download of browser extensions are
switched off; the agent's temporary files live in one directory removed at exit.

It prints one JSON line (and writes it to ``--result``): whether the agent said it was
done and successful, its final text, the URLs it visited, its actions and errors. Exit
status: 0 when the agent finished (done), 1 when it did not, 2 for bad arguments.
This file runs in the harness's own virtual environment and imports nothing of Forge.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

VERSION_NOTE = "browser-use 0.13.14 (.harnesses/browser-use/requirements.txt)"
# Everything that would reach the internet besides the model's calls.
QUIET_ENV = {
    "ANONYMIZED_TELEMETRY": "false",
    "BROWSER_USE_CLOUD_SYNC": "false",
    "BROWSER_USE_VERSION_CHECK": "false",
    "BROWSER_USE_DISABLE_EXTENSIONS": "1",
    "BROWSER_USE_CLOUD_HINTS": "false",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="browser_harness", description=__doc__.split("\n\n")[0])
    p.add_argument("--task", required=True, help="the instruction the agent gets")
    p.add_argument("--url", required=True, help="the page the browser opens first")
    p.add_argument("--model", default="gpt-4.1-mini", help="model named in the calls")
    p.add_argument("--max-steps", type=int, default=8, help="agent steps at most")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds for the whole run")
    p.add_argument("--chromium", default=None, help="browser binary (default: chromium on PATH)")
    p.add_argument("--result", type=Path, default=None, help="also write the result JSON here")
    args = p.parse_args(argv)
    args.chromium = args.chromium or shutil.which("chromium") or shutil.which("chromium-browser")
    if not args.chromium or not Path(args.chromium).exists():
        p.error("no chromium: install Debian's chromium package or pass --chromium PATH")
    if not 1 <= args.max_steps <= 100:
        p.error("--max-steps must be between 1 and 100")
    return args


async def run_agent(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    from browser_use import Agent, BrowserProfile, BrowserSession
    from browser_use.llm import ChatOpenAI

    profile = BrowserProfile(
        executable_path=args.chromium,
        headless=True,
        chromium_sandbox=os.geteuid() != 0,  # Chromium refuses its sandbox as root
        enable_default_extensions=False,
        user_data_dir=None,
        downloads_path=scratch / "downloads",
        keep_alive=False,
        args=["--no-proxy-server"],
    )
    agent = Agent(
        task=args.task,
        llm=ChatOpenAI(model=args.model),
        browser_session=BrowserSession(browser_profile=profile),
        use_vision=True,
        use_judge=False,
        max_failures=2,
        initial_actions=[{"navigate": {"url": args.url}}],
    )
    history = await agent.run(max_steps=args.max_steps)
    return {
        "done": history.is_done(),
        "success": history.is_successful(),
        "final": history.final_result(),
        "steps": history.number_of_steps(),
        "urls": [u for u in history.urls() if u],
        "actions": history.model_actions(),
        "errors": [e for e in history.errors() if e],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="forge-browser-"))
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    os.environ["BROWSER_USE_CONFIG_DIR"] = str(scratch / "config")
    os.environ["TMPDIR"] = str(scratch)  # browser-use's temporary profile and files
    tempfile.tempdir = str(scratch)
    try:
        result = asyncio.run(asyncio.wait_for(run_agent(args, scratch), args.timeout))
    except TimeoutError:
        result = {"done": False, "success": None, "error": f"timed out after {args.timeout} s"}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    line = json.dumps(result, default=str)
    print(line, flush=True)
    if args.result is not None:
        args.result.write_text(line + "\n")
    return 0 if result.get("done") else 1


if __name__ == "__main__":
    sys.exit(main())
