"""``make demo``: record a small harness with Forge, then query what was recorded.

No LLM is reachable from a machine without internet, so a scripted provider stands
in for api.openai.com (it speaks the real Chat Completions wire format). The toy
harness (``rl/toy_harness.py``, an ordinary openai-SDK program) runs unmodified under
``forge record``, three times; then DuckDB queries the Parquet shards.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.reconstruct import reconstruct_request
from pipeline.store import connect

TASKS = [
    "Create hello.txt containing hi.",
    "Create notes.txt with one line: done.",
    "Write the date into today.txt.",
]
# The scripted provider: consult a helper process, run one shell command, then finish.
SCRIPT = [
    {"tool_call": {"name": "consult", "arguments": {"question": "What should the file hold?"}}},
    {"tool_call": {"name": "shell", "arguments": {"command": "echo hi > hello.txt"}}},
    {"text": "Done: the file is written."},
]
QUERIES = {
    "calls per rollout and process": """
        SELECT rollout_id, process_name, pid, count(*) AS calls,
               sum(input_tokens) AS tokens_in, sum(output_tokens) AS tokens_out
        FROM calls GROUP BY ALL ORDER BY rollout_id, calls DESC""",
    "one rollout, call by call": """
        SELECT call_id, api, transport, model, status, request_items, tool_calls, round(duration_ms, 1) AS ms
        FROM calls WHERE rollout_id = 'demo-1' ORDER BY call_id""",
    "storage: content-addressed vs logging every request": """
        SELECT (SELECT sum(content_bytes) FROM messages) AS stored_bytes,
               (SELECT sum(request_bytes) FROM calls) AS raw_request_bytes""",
}


def show(con, title: str, sql: str) -> None:  # type: ignore[no-untyped-def]
    print(f"\n-- {title}\n{' '.join(sql.split())}")
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    rows = cur.fetchall()
    widths = [max(len(str(x)) for x in [n, *[r[i] for r in rows]]) for i, n in enumerate(names)]
    print("  ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)))
    for r in rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=True)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="forge-demo", description=__doc__.splitlines()[0] if __doc__ else None
    )
    p.add_argument("--out", type=Path, default=Path("data/runs/demo"))
    args = p.parse_args(argv)
    from tests.support.upstream import ScriptedUpstream  # the scripted provider

    out = args.out.resolve()
    if out.exists():
        shutil.rmtree(out)
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["OPENAI_API_KEY"] = "sk-demo-not-a-real-key"
    with ScriptedUpstream(SCRIPT, side_text="It should hold the word hi.") as provider:
        print(f"forge demo: scripted provider for api.openai.com on {provider.base_url}")
        for i, task in enumerate(TASKS, 1):
            work = Path(tempfile.mkdtemp(prefix=f"forge-demo-{i}-"))
            cmd = [
                sys.executable,
                "-m",
                "forge_cli.main",
                "record",
                "--out",
                str(out),
                "--rollout",
                f"demo-{i}",
                "--upstream",
                f"api.openai.com={provider.base_url}",
                "--",
                sys.executable,
                "-m",
                "rl.toy_harness",
                task,
            ]
            print(
                f"\n$ forge record --out {args.out} --rollout demo-{i} --upstream api.openai.com=... "
                f"-- python -m rl.toy_harness {task!r}"
            )
            done = subprocess.run(cmd, cwd=work, env=env, timeout=300)
            shutil.rmtree(work, ignore_errors=True)
            if done.returncode != 0:
                print(
                    f"forge demo: rollout {i} failed with exit code {done.returncode}",
                    file=sys.stderr,
                )
                return done.returncode
    con = connect(out)
    for title, sql in QUERIES.items():
        show(con, title, sql)
    first = con.execute(
        "SELECT call_id FROM calls WHERE rollout_id = 'demo-1' ORDER BY call_id DESC LIMIT 1"
    ).fetchone()
    if first:
        body = reconstruct_request(con, first[0])
        print(
            f"\n-- the last call of demo-1, rebuilt from the content-addressed store: "
            f"{len(body['messages'])} messages, model {body['model']}"
        )
    print(f"\nforge demo: wrote {out} (calls/, messages/, endpoints/ Parquet shards).")
    print(
        f'Try: .venv/bin/python -c "from pipeline.store import connect; '
        f"print(connect('{args.out}').sql('select * from calls'))\""
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
