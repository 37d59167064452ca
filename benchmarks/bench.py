"""Benchmark: median time of `ctx build` and of `assemble()` alone, on generated stories.

    python benchmarks/bench.py                 # 1k, 10k, 100k messages, cl100k_base
    python benchmarks/bench.py --tokenizer estimate --sizes 1000 10000

Stories come from storygen.py: scenes of 20 messages, every scene summarised, one in ten
with a history. `ctx build` is timed as a whole process (Python start-up, reading the file,
assembling, rendering, printing); `assemble()` is timed in-process on the story already
read, with a fresh token counter each run so nothing is cached between runs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import storygen  # noqa: E402

from otaku_ctx.assembler import assemble  # noqa: E402
from otaku_ctx.build import budget_of, renderer_for, shape_of  # noqa: E402
from otaku_ctx.config import load_settings  # noqa: E402
from otaku_ctx.pricing import TemplatePricer  # noqa: E402
from otaku_ctx.readers import read_story  # noqa: E402
from otaku_ctx.tokens import make_counter  # noqa: E402


def median_seconds(action, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--tokenizer", default="cl100k_base", choices=["cl100k_base", "estimate"])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    ctx = Path(sys.executable).with_name("ctx")
    settings = load_settings(overrides={"model.tokenizer": (args.tokenizer, "--tokenizer")})
    print(f"tokenizer {args.tokenizer}, window {settings['model.window']:,}, median of {args.runs} runs")
    print(f"{'messages':>9}  {'file':>8}  {'read':>8}  {'assemble()':>10}  {'ctx build':>9}  case  tokens")
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            path = Path(tmp) / f"story-{n}.jsonl"
            storygen.write(path, storygen.records(n))
            story = read_story(path)

            def assemble_once(story=story):
                counter = make_counter(args.tokenizer)
                budget = budget_of(story, settings, counter)
                pricer = TemplatePricer(renderer_for(story, settings, reserve=budget.reserve), counter)
                return assemble(story, shape_of(settings), budget.limit, pricer, reserve=budget.reserve)

            a = assemble_once()
            read = median_seconds(lambda path=path: read_story(path), args.runs)
            alone = median_seconds(assemble_once, args.runs)
            command = [str(ctx), "build", str(path), "--tokenizer", args.tokenizer]
            whole = median_seconds(lambda c=command: subprocess.run(c, check=True, capture_output=True), args.runs)
            size = path.stat().st_size / 1e6
            print(
                f"{n:>9,}  {size:>6.1f}MB  {read * 1000:>6.0f}ms  {alone * 1000:>8.0f}ms  "
                f"{whole * 1000:>7.0f}ms  {a.case:>4}  {a.tokens:,}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
