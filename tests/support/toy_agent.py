"""A scripted agent for rollout tests and benchmarks: it acts on what the task asks.

Used as a ``ScriptedUpstream`` script; the reply depends on the conversation only (the
task's instruction and the number of tool results so far), so any number of rollouts can
share one upstream. Instructions it understands (anywhere in the conversation):

* ``Create NAME containing hi.``: a shell call ``echo hi > NAME``, then "Done.";
* ``fix the typo``: ``sed -i s/helo/hello/ README.md`` (data/tasks/demo.jsonl);
* ``[forge-test:hang]``: a shell call that sleeps for ``HANG_SECONDS`` (the rollout's
  timeout must kill it), with a marker in its command line to find leftovers;
* ``[forge-test:crash]``: a shell call that SIGKILLs the harness (the tool's parent);
* ``[forge-test:loop]``: a shell call on every turn (the toy harness runs out of turns);
* anything else: "Done." at once.
"""

from __future__ import annotations

import json
import re
from typing import Any

HANG_SECONDS = 987  # distinctive: leftovers are found by "sleep 987" in their command line
HANG_MARKER = f"sleep {HANG_SECONDS}"
_CREATE = re.compile(r"Create ([A-Za-z0-9_.-]+) containing hi")


def _shell(command: str) -> dict[str, Any]:
    return {"tool_call": {"name": "shell", "arguments": {"command": command}}}


def toy_agent(conv: Any) -> Any:
    """The script: a ScriptedUpstream callable over a Conversation."""
    text = json.dumps(list(conv.history)[:4])
    first = conv.tool_results == 0
    if "[forge-test:hang]" in text:
        return _shell(HANG_MARKER) if first else {"text": "Slept."}
    if "[forge-test:crash]" in text:
        return _shell("kill -KILL $PPID") if first else {"text": "Still here?"}
    if "[forge-test:loop]" in text:
        return _shell("true")
    if first and "fix the typo" in text:
        return _shell("sed -i s/helo/hello/ README.md")
    if first and (m := _CREATE.search(text)):
        return _shell(f"echo hi > {m.group(1)}")
    return {"text": "Done."}
