"""``forge export sft``: SFT data in the OpenAI messages + tools format, one example per agent chain."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from forge_cli.cmd_snapshot import add_filter_arguments, filters_from
from mitm_addon.launch import ForgeError
from pipeline.export import write_sft
from pipeline.snapshot import FilterError
from pipeline.store import connect

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        help="export recorded trajectories as training data",
        description="Export recorded trajectories in a format other tools train on.",
    )
    kinds = p.add_subparsers(dest="kind", required=True, metavar="KIND")
    sft = kinds.add_parser(
        "sft",
        help="OpenAI chat messages + tools per agent chain, as Parquet",
        description="One example per agent chain (sub-agents are their own examples): the "
        "chain's whole conversation from its last call, converted from the Anthropic "
        "Messages, Chat Completions or Responses format to OpenAI chat messages (tool_calls, "
        "role tool), with the request's tools as OpenAI function tools. The Parquet file "
        'loads with datasets.load_dataset("parquet", data_files=OUT) and has the columns '
        "messages and tools that SFT trainers (TRL's SFTTrainer) read, plus metadata.",
    )
    sft.add_argument("--data", type=Path, required=True, help="run directory")
    sft.add_argument("--out", type=Path, required=True, help="Parquet file to write (replaced)")
    add_filter_arguments(sft)
    sft.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.kind != "sft":
        raise ForgeError(f"unknown export kind {args.kind!r}; known: sft")
    if not args.data.is_dir():
        raise ForgeError(f"--data {args.data}: no such run directory")
    con = connect(args.data, stitched=True)
    try:
        result = write_sft(con, args.out, filters_from(args))
    except FilterError as e:
        raise ForgeError(f"{e}; the columns are those of the trajectories view") from None
    finally:
        con.close()
    note = f", {result.skipped} chain(s) left out (see the log)" if result.skipped else ""
    print(f"forge: {result.rows} SFT example(s) written to {result.path}{note}")
    return 0
