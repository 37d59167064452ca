"""Where one `ctx build` spends its time, phase by phase, in one fresh process.

    PYTHONPATH=<repo> python benchmarks/phases.py story.jsonl [--template serene] [--window 8192] ...

Mirrors `otaku_ctx.build.Pipeline.build()` step by step with a clock around each step and prints one
JSON object: milliseconds for start-up (importing the CLI), the tokenizer, reading the story,
the template (loading and compiling it, with the renderer), assembling, rendering, and the
total. It calls ctx's internal functions, so when they change this may stop matching; bench.py
then reports the phases as unavailable instead of failing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("story", type=Path)
    parser.add_argument("--template")
    parser.add_argument("--tokenizer")
    parser.add_argument("--window", type=int)
    parser.add_argument("--head", type=int)
    parser.add_argument("--tail", type=int)
    args = parser.parse_args(argv)
    ms: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        ms[name] = round((now - clock) * 1000, 1)
        clock = now

    start = clock
    import otaku_ctx.cli.app  # noqa: F401 - what every run pays before it does anything
    from otaku_ctx.build import Pipeline
    from otaku_ctx.config import load_settings
    from otaku_ctx.story.detect import read_story

    overrides = {}
    for key, value in (
        ("prompt.template", args.template),
        ("model.tokenizer", args.tokenizer),
        ("model.window", args.window),
        ("context.head_messages", args.head),
        ("context.min_tail_messages", args.tail),
    ):
        if value is not None:
            overrides[key] = (value, "benchmark")
    settings = load_settings(overrides=overrides)
    lap("start-up")
    pipeline = Pipeline(settings)
    pipeline.count("warm up")
    lap("tokenizer")
    story = read_story(args.story)
    lap("read")
    prepared = pipeline.prepare(story)
    budget = pipeline.budget(story)
    lore = pipeline.lore(prepared, budget)
    lap("template")
    attempt = pipeline.attempt(prepared, lore, budget)
    assembly = attempt.assembly
    lap("assemble")
    prompt = pipeline.render(attempt).prompt
    lap("render")
    ms["total"] = round((time.perf_counter() - start) * 1000, 1)
    ms["case"] = assembly.case
    ms["prompt chars"] = len(prompt or "")
    print(json.dumps(ms))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
