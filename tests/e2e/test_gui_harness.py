"""A real GUI harness under ``forge record``: the browser-use agent, as it ships, drives
Debian's headless Chromium through two tasks on pages this test serves, its model
scripted in the agent's own reply format. Every call lands with its screenshot, each
rollout stitches into one tree, the verifier passes one task and fails the other, and
``forge view`` shows the screenshots (checked in headless Chromium)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from forge_cli.main import main as forge
from pipeline.images import image_hash, image_size
from pipeline.store import audits, connect
from tests.e2e.test_record_sdks import assert_recorded_as_received
from tests.support.chromium import chromium, find_chromium
from tests.support.forge_proxy import files_containing, password_args
from tests.support.gui_site import TASKS, browser_use_script, gui_site
from tests.support.upstream import ScriptedUpstream

pytestmark = [pytest.mark.slow, pytest.mark.harness]

REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".harnesses" / "browser-use" / "venv" / "bin" / "python"
RUNNER = REPO / "k8s_jobs" / "browser_harness.py"
KEY = "sk-test-browser-use-4f1c"  # must never reach disk
ARTIFACTS = Path(os.environ.get("FORGE_TEST_ARTIFACTS", "test-artifacts")) / "gui"
# What the scripted model does in each task: fill and submit the form (the verifier
# passes it); open the wrong page and call it done (the verifier fails it).
PLANS: dict[str, list[list[dict[str, Any]]]] = {
    "sign-up": [
        [{"input": {"find": "input name", "text": "Ada", "clear": True}}],
        [{"click": {"find": "button Submit"}}],
        [{"done": {"text": "Signed up as Ada.", "success": True, "files_to_display": []}}],
    ],
    "pricing": [
        [{"click": {"find": "a About us"}}],
        [{"done": {"text": "Here is the pricing page.", "success": True, "files_to_display": []}}],
    ],
}
ACTIONS = {"sign-up": [["type"], ["click"], ["done"]], "pricing": [["click"], ["done"]]}


def unavailable() -> str | None:
    if not PYTHON.exists():
        return f"browser-use is not installed ({PYTHON} missing; run scripts/install_browser_harness.sh)"
    if find_chromium() is None:
        return "Debian's chromium is not installed (apt-get install chromium)"
    return None


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory, confdir: Path) -> dict[str, Any]:
    """Both tasks recorded into one run directory, one rollout each, and their rewards."""
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("gui")
    out = tmp / "run"
    runs: dict[str, Any] = {}
    for task_id, plan in PLANS.items():
        task = TASKS[task_id]
        with gui_site() as site, ScriptedUpstream(browser_use_script(plan)) as up:
            argv = [
                sys.executable, "-m", "forge_cli.main", "record", "--out", str(out),
                "--rollout", f"{task_id}-1", "--task", task_id, "--harness", "browser-use",
                "--confdir", str(confdir), "--upstream", f"api.openai.com={up.base_url}",
                *password_args(tmp / "secrets"), "--",
                str(PYTHON), str(RUNNER), "--task", task.instruction,
                "--url", site.url(task.start), "--max-steps", "6", "--result", str(tmp / f"{task_id}.json"),
            ]  # fmt: skip
            env = {"PATH": os.environ["PATH"], "HOME": str(tmp / "home"), "OPENAI_API_KEY": KEY}
            done = subprocess.run(
                argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300
            )
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            passed = site.verify(task)
            received = up.received
        # The verifier's reward, as a user would write it.
        assert forge(["reward", "--data", str(out), "--rollout", f"{task_id}-1",
                      "--reward", "1" if passed else "0"]) == 0  # fmt: skip
        result = json.loads((tmp / f"{task_id}.json").read_text())
        runs[task_id] = {"passed": passed, "received": received, "result": result}
    return {"out": out, "tmp": tmp, "runs": runs}


def test_the_verifier_passes_one_task_and_fails_the_other(recorded: dict[str, Any]) -> None:
    runs = recorded["runs"]
    assert (runs["sign-up"]["passed"], runs["pricing"]["passed"]) == (True, False)
    # The agent said it succeeded both times: only the verifier tells them apart.
    assert runs["sign-up"]["result"]["success"] is True
    assert runs["pricing"]["result"]["success"] is True
    con = connect(recorded["out"], stitched=True)
    rows = con.execute(
        "SELECT rollout_id, task_id, harness, status, reward, n_calls FROM trajectories ORDER BY 1"
    ).fetchall()
    assert rows == [
        ("pricing-1", "pricing", "browser-use", "complete", 0.0, 2),
        ("sign-up-1", "sign-up", "browser-use", "complete", 1.0, 3),
    ]


def test_every_call_is_recorded_with_its_screenshot_and_its_actions(
    recorded: dict[str, Any],
) -> None:
    out = recorded["out"]
    con = connect(out)
    for task_id, run in recorded["runs"].items():
        calls = con.execute(
            "SELECT call_id, api, status, request_images, actions FROM calls "
            "WHERE rollout_id = ? ORDER BY call_id",
            [f"{task_id}-1"],
        ).fetchall()
        sent = []  # the screenshots the upstream received, from its request bodies
        for r in run["received"]:
            parts = r.body["messages"][-1]["content"]
            urls = [p["image_url"]["url"] for p in parts if p.get("type") == "image_url"]
            sent.append([base64.b64decode(u.split(",", 1)[1]) for u in urls])
        assert [len(s) for s in sent] == [1] * len(PLANS[task_id])  # one screenshot a step
        assert [(api, status) for _, api, status, *_ in calls] == [
            ("openai_chat", "complete")
        ] * len(sent)
        assert [imgs for *_, imgs, _ in calls] == [[image_hash(p) for p in s] for s in sent]
        assert [acts for *_, acts in calls] == ACTIONS[task_id]
        for shots in sent:
            (png,) = shots
            row = con.execute(
                "SELECT bytes, width, height, data FROM images WHERE hash = ?", [image_hash(png)]
            ).fetchone()
            assert row is not None and bytes(row[3]) == png
            assert (row[0], (row[1], row[2])) == (len(png), image_size(png))
    # Every request, screenshot included, rebuilds from the shards exactly as received.
    up_calls = [r for run in recorded["runs"].values() for r in run["received"]]

    class Both:
        received = up_calls

    assert_recorded_as_received(out, Both())  # type: ignore[arg-type]
    # No stored item holds a PNG's base64 (it starts "iVBORw0KGgo"): they hold references.
    (inline,) = con.execute(
        "SELECT count(*) FROM messages WHERE contains(content_json, 'iVBORw0KGgo')"
    ).fetchone()
    assert inline == 0
    assert files_containing(out, [KEY]) == []


def test_each_rollout_stitches_into_one_tree_with_every_audit_empty(
    recorded: dict[str, Any],
) -> None:
    con = connect(recorded["out"], stitched=True)
    assert {k: v for k, v in audits(con).items() if v} == {}
    # browser-use rebuilds its two messages at every step: each call hangs from the one
    # before it (the same process), its history rewritten.
    edges = con.execute(
        "SELECT rollout_id, kind, evidence, count(*) FROM edges GROUP BY ALL ORDER BY 1"
    ).fetchall()
    assert edges == [
        ("pricing-1", "compacts", "process_tree", 1),
        ("sign-up-1", "compacts", "process_tree", 2),
    ]
    behaviour = con.execute(
        "SELECT rollout_id, n_gui_actions, n_clicks, n_typed FROM behaviour ORDER BY 1"
    ).fetchall()
    assert behaviour == [("pricing-1", 2, 1, 0), ("sign-up-1", 3, 1, 1)]


def test_forge_view_shows_every_screenshot_in_headless_chromium(recorded: dict[str, Any]) -> None:
    out, tmp = recorded["out"], recorded["tmp"]
    assert forge(["view", "--data", str(out), "--out", str(tmp / "pages")]) == 0
    stored = dict(connect(out).execute("SELECT hash, first_call_id FROM images").fetchall())
    sizes = {
        h: (w, hh)
        for h, w, hh in connect(out).execute("SELECT hash, width, height FROM images").fetchall()
    }
    with chromium(tmp / "chromium") as browser:
        seen = {}
        for task_id in PLANS:
            page = browser.new_page()
            page.navigate((tmp / "pages" / f"{task_id}-1.html").resolve().as_uri())
            page.wait_until("document.documentElement.dataset.viewer === 'ready'", "the page")
            page.evaluate("document.getElementById('open-all').click()")
            page.wait_until("Array.from(document.images).every((i) => i.complete)", "the images")
            shots = json.loads(
                page.evaluate(
                    "JSON.stringify(Array.from(document.images).map((i) => [i.dataset.ref, "
                    "i.naturalWidth, i.naturalHeight, i.getClientRects().length > 0, "
                    "i.closest('details.call').dataset.callId]))"
                )
            )
            assert page.script_errors() == []
            page.screenshot(ARTIFACTS / f"{task_id}.png")
            page.close()
            for ref, w, h, laid_out, call in shots:
                assert laid_out and (w, h) == sizes[ref]
                seen[ref] = call
    assert seen == stored  # every screenshot, at the call that sent it
