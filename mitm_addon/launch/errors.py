"""The one error a Forge user acts on: every library raises it (or a subclass) with a
message that says how to fix the problem, and the ``forge`` command prints it."""

from __future__ import annotations


class ForgeError(RuntimeError):
    """A failure the user can act on; the message says how."""
