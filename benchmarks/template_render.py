"""How long the shipped templates take to render a chat, median of several runs.

    python benchmarks/template_render.py [--messages 200] [--runs 7]
    python benchmarks/template_render.py --smoke    # once, small: 50 messages, 1 run

The figures are for reading, never asserted in a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from otaku_ctx.render.lookup import load_template  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, help="the chat's length (default 200)")
    parser.add_argument("--runs", type=int, help="runs per template, the median reported (default 7)")
    parser.add_argument("--smoke", action="store_true", help="once, small: 50 messages, 1 run")
    args = parser.parse_args()
    if args.messages is None:
        args.messages = 50 if args.smoke else 200
    if args.runs is None:
        args.runs = 1 if args.smoke else 7
    chat = [
        {"role": ("user", "assistant")[n % 2], "name": "N", "message": "line " * 40, "kind": "message"}
        for n in range(args.messages)
    ]
    context = {"chatMessages": chat, "postHistory": {"targetIndex": args.messages - 1, "hasContent": False}}
    print(f"{args.messages} messages, median of {args.runs} runs")
    for name in ("default", "serene", "sillytavern"):
        template = load_template(name)
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            template.render(context)
            times.append(time.perf_counter() - start)
        print(f"  {name:<12} {statistics.median(times) * 1000:7.2f} ms")


if __name__ == "__main__":
    main()
