"""Run the benchmarks and merge their figures into bench/results.json and bench/results.md.

    python -m bench.run_all                 # full sizes: 1,000,000 calls; 10, 100, 1000 turns;
                                            # proxy overhead at its default (quoted) size
    python -m bench.run_all --quick         # a smoke run at small sizes (not for quoting)
    python -m bench.run_all --only storage  # one benchmark

Each benchmark replaces its own entry in the results files and keeps the others', so
benchmarks added later (proxy overhead, rollouts per minute) merge into the same files.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from bench import (
    bench_gui_storage,
    bench_pipeline,
    bench_proxy,
    bench_rollouts,
    bench_serve,
    bench_storage,
    bench_train,
    results,
)

BENCHMARKS: dict[str, Callable[[argparse.Namespace], list[str]]] = {
    "proxy": lambda a: [
        *(["--full"] if a.proxy_full else []),
        *(["--scale", "0.2"] if a.quick else []),
        *(f"--skip={name}" for name in a.proxy_skip),
    ],
    "storage": lambda a: ["--turns", a.turns, "--seed", str(a.seed)],
    "gui_storage": lambda a: [],  # the size: 50 steps re-sending the last 5
    # the size: 32 toy rollouts at parallelism 8 (quick: 8 at 4)
    "rollouts": lambda a: [] if a.quick else ["--tasks", "8", "-n", "4", "--parallel", "8"],
    "pipeline": lambda a: [
        "--calls",
        str(a.calls),
        "--seed",
        str(a.seed),
        "--repeat",
        str(a.repeat),
    ],
    "serve": lambda a: ["--skip-harnesses"] if a.quick else [],
    # one thread: on 2 shared cores two threads make single steps vary 3x
    "train": lambda a: ["--threads", "1", *(["--rounds", "3"] if a.quick else [])],
}
_MAINS: dict[str, Callable[[list[str]], int]] = {
    "proxy": bench_proxy.main,
    "storage": bench_storage.main,
    "gui_storage": bench_gui_storage.main,
    "pipeline": bench_pipeline.main,
    "rollouts": bench_rollouts.main,
    "serve": bench_serve.main,
    "train": bench_train.main,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run_all", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--calls", type=int, default=1_000_000, help="pipeline benchmark size")
    parser.add_argument("--turns", default="10,100,1000", help="storage benchmark lengths")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--proxy-full", action="store_true", help="proxy benchmark at 10x its default calls"
    )
    parser.add_argument(
        "--proxy-skip",
        choices=bench_proxy.CONTENDERS[1:],
        action="append",
        default=[],
        help="leave a proxy contender out (its figures are then null, with the reason)",
    )
    parser.add_argument(
        "--only",
        choices=sorted(BENCHMARKS),
        action="append",
        help="run only this benchmark (repeatable)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes (20,000 calls; 10 and 100 turns; best of 1; a fifth of the proxy calls)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        help="folder of results.json and results.md (default: bench/, or bench/out/quick "
        "with --quick, so that a smoke run never replaces quoted figures)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.turns, args.repeat = 20_000, "10,100", 1
    if args.results is None:
        args.results = results.BENCH_DIR / "out" / "quick" if args.quick else results.BENCH_DIR
    args.results.mkdir(parents=True, exist_ok=True)
    for name in args.only or list(BENCHMARKS):
        print(f"== {name}", flush=True)
        code = _MAINS[name]([*BENCHMARKS[name](args), "--results", str(args.results)])
        if code:
            return code
    results.add_required(args.results / "results.json", args.results / "results.md")
    data = results.load(args.results / "results.json")
    print(json.dumps(data["figures"], indent=2))
    for key, reason in data["missing"].items():
        print(f"{key} is null: {reason}")
    print(f"wrote {args.results / 'results.json'} and {args.results / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
