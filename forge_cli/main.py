"""``forge``: one entry point, a subcommand per job."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from mitm_addon.launch import ForgeError

# Subcommand modules, in the order ``forge --help`` lists them; each has add_parser(sub).
COMMANDS = (
    "record",
    "cmd_sql",
    "cmd_tree",
    "cmd_view",
    "cmd_snapshot",
    "cmd_export",
    "cmd_reward",
    "cmd_eval",
    "cmd_rollout",
    "cmd_k8s",
    "cmd_train",
    "cmd_loop",
    "cmd_init_model",
    "cmd_serve_policy",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forge",
        description="Train agents inside the real harness they ship with.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"forge_cli.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="forge: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ForgeError as e:
        print(f"forge: error: {one_line(e)}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:  # a path that cannot be read or written, or input
        # that cannot be parsed (the errors of Forge's readers name the file): one line
        print(f"forge: error: {one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("forge: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a failure no command foresaw: still one line, and how to see more
        if os.environ.get("FORGE_DEBUG") == "1":
            raise
        print(
            f"forge: error: {type(e).__name__}: {one_line(e)} (FORGE_DEBUG=1 prints the traceback)",
            file=sys.stderr,
        )
        return 1


def one_line(error: BaseException) -> str:
    """An error's message on one line: its lines joined, a parser's caret lines dropped."""
    lines = (line.strip() for line in str(error).splitlines())
    return "; ".join(line for line in lines if line.strip("^ ")) or type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
