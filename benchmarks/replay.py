"""The figures of docs/caching.md: `ctx replay` on the bundled examples, the otaku samples and
the long fixture, under both cache policies.

    python benchmarks/replay.py
    python benchmarks/replay.py --smoke    # once, small: 20 turns a row

--smoke (benchmarks/smoke.sh) replays 20 turns a row, to show the benchmark still works: each
story's last 20 (its longest prompts, the window fullest), and the pressure row's first 20 (from
turn 173); its figures are those turns' alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from otaku_ctx.build import open_story
from otaku_ctx.config import load_settings
from otaku_ctx.replay import replay

ROOT = Path(__file__).resolve().parents[1]
STORIES = [
    (ROOT / "examples" / "lighthouse-case3.jsonl", 8192),
    (ROOT / "examples" / "lighthouse-case4.jsonl", 8192),
    (ROOT / "tests" / "fixtures" / "otaku" / "river.md", 8192),
    (ROOT / "tests" / "fixtures" / "otaku" / "tour.md", 65536),  # at 16k nearly every turn is refused
    (ROOT / "tests" / "fixtures" / "replay-long.jsonl", 40000),
]
# The long fixture again from its first turn under pressure (cases 3-5 from then on): the
# turns the targets are about, without the 172 easy turns before them.
PRESSURE = (ROOT / "tests" / "fixtures" / "replay-long.jsonl", 40000, 173)
SMOKE_TURNS = 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help=f"once, small: {SMOKE_TURNS} turns a row")
    args = parser.parse_args()
    print("| story | window | policy | prefix turns | tokens reused | reprocessed mean / p95 | unused | transitions |")
    print("|---|---|---|---|---|---|---|---|")
    for path, window, first in [(p, w, None) for p, w in STORIES] + [PRESSURE]:
        story = open_story(path)
        last = None
        if args.smoke and first is None:
            first = max(1, len(story) - SMOKE_TURNS + 1)
        elif args.smoke:
            last = min(len(story), first + SMOKE_TURNS - 1)
        turns = f"{len(story)} msgs" if first is None else f"turns {first}–{last or len(story)}"
        for cache in ("exact", "stable"):
            settings = load_settings(overrides={"model.window": (window, "bench"), "context.cache": (cache, "bench")})
            f = replay(story, settings, first=first, last=last).facts()
            r = f["reprocessed"]
            print(
                f"| {path.name} ({turns}) | {window:,} | {cache} | {f['prefix_share']:.1%} | "
                f"{f['reused_share']:.1%} | {r['mean']:,.0f} / {r['p95']:,} | {f['unused_share']:.1%} | "
                f"{len(f['transitions'])} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
