"""``forge``: one entry point, a subcommand per job."""

from __future__ import annotations

import argparse
import logging
import sys

from forge_cli import record
from forge_cli.proxy import ForgeError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forge",
        description="Train agents inside the real harness they ship with.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    record.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="forge: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ForgeError as e:
        print(f"forge: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
