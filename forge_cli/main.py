"""``forge``: one entry point, a subcommand per job."""

from __future__ import annotations

import argparse
import importlib
import logging
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
        print(f"forge: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a path that cannot be read or written: said in one line
        print(f"forge: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
