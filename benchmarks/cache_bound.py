"""The figures of docs/caching.md's "Against the bound": `ctx replay --bound` on three stories at
two limits each, under both cache policies, beside the hindsight optimum (issue 19).

    python benchmarks/cache_bound.py            # the table
    python benchmarks/cache_bound.py --no-bound # the policies alone (what main measured before)
    python benchmarks/cache_bound.py --write-tour OUT.jsonl  # the tour conversion, as native JSONL
    python benchmarks/cache_bound.py --smoke    # once, small: each story at its first limit, 10 turns

The stories, every one replayed every 2 turns from the turn its window first fills (the first
turn in cases 3-5), with `--tokenizer estimate --reserve 0` as the issue measured:

- `tour`: otaku's own sample, "The Vermilion Tour" (tests/fixtures/otaku/tour.md: 318 messages,
  15 scenes, its cast's four cards), converted with the cards' example dialogue left out. The
  default template prints example dialogue as the post-history reminder, which moves down a
  message every turn and keeps any prompt from being a prefix of the next (docs/caching.md,
  "What a backend reuses"); without it the prefix can hold, and the policy is what decides.
- `long`: tests/fixtures/replay-long.jsonl (318 messages, 15 scenes with histories).
- `generated`: 2,000 messages of 1 to 30 sentences (storygen, seed 19), scenes of 25, a
  history every third scene, cards at messages 5, 600 and 1,400.

--smoke replays each story at its first limit only, and only the first 10 turns of that replay
(the turns where the window has just filled): the same table, to show it still works.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from otaku_ctx.build import build, open_story
from otaku_ctx.config import load_settings
from otaku_ctx.replay import replay, story_at
from otaku_ctx.story.detect import read_story
from otaku_ctx.story.model import Story

ROOT = Path(__file__).resolve().parents[1]
LIMITS = {"tour": (40_000, 32_000), "long": (40_000, 30_000), "generated": (32_000, 16_000)}
EVERY = 2
SMOKE_TURNS = 10  # --smoke: the replayed turns of each story


def tour() -> Story:
    """otaku's tour.md with its cards, their example dialogue left out (see the docstring)."""
    story = open_story(ROOT / "tests" / "fixtures" / "otaku" / "tour.md")
    messages = tuple(
        replace(m, card=replace(m.card, example_dialogue="")) if m.card is not None else m for m in story.messages
    )
    return replace(story, messages=messages)


def generated() -> Story:
    from storygen import records, write

    recs = records(
        2000, seed=19, scene_size=25, history_every=3, summary_sentences=8, message_sentences=(1, 30),
        cards_at=(5, 600, 1400),
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "generated.jsonl"
        write(path, recs)
        return read_story(path)


STORIES = {
    "tour": tour,
    "long": lambda: read_story(ROOT / "tests" / "fixtures" / "replay-long.jsonl"),
    "generated": generated,
}


def settings_for(limit: int, cache: str, **more: object):
    given = {"model.window": limit, "model.tokenizer": "estimate", "context.reply_reserve": 0, "context.cache": cache}
    return load_settings(overrides={k: (v, "bench") for k, v in {**given, **more}.items()})


def first_full(story: Story, limit: int) -> int:
    """The first turn the window cannot hold whole (cases 3-5), by bisection: a story that fits
    at turn n fits at every turn before it."""
    settings = settings_for(limit, "exact")
    low, high = 1, len(story)
    while low < high:
        middle = (low + high) // 2
        if build(story_at(story, middle), settings).assembly.case in (1, 2):
            low = middle + 1
        else:
            high = middle
    return low


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-bound", action="store_true")
    parser.add_argument("--write-tour", type=Path)
    parser.add_argument("--only", choices=sorted(STORIES))
    parser.add_argument("--smoke", action="store_true", help=f"once, small: the first limit, {SMOKE_TURNS} turns")
    args = parser.parse_args()
    if args.write_tour:
        from otaku_ctx.build import native_text

        args.write_tour.write_text(native_text(tour()), encoding="utf-8")
        return 0
    head = "| story | limit | turns | policy | prefix kept | tokens reused | reprocessed mean | transitions | unused |"
    if not args.no_bound:
        head += " bound: reprocessed mean | bound: prefix kept | bound: unused | policy ÷ bound |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for name, make in STORIES.items():
        if args.only and name != args.only:
            continue
        story = make()
        for limit in LIMITS[name][:1] if args.smoke else LIMITS[name]:
            first = first_full(story, limit)
            last = min(len(story), first + EVERY * (SMOKE_TURNS - 1)) if args.smoke else None
            # The bound does not depend on the policy: computed once, with the stable replay.
            stable = replay(
                story, settings_for(limit, "stable"), first=first, last=last, every=EVERY, bound=not args.no_bound
            )
            exact = replay(story, settings_for(limit, "exact"), first=first, last=last, every=EVERY)
            for cache, result in (("exact", exact), ("stable", stable)):
                f = result.facts()
                row = (
                    f"| {name} | {limit:,} | {f['first']}–{f['last']} every {EVERY} | {cache} | "
                    f"{f['prefix_share']:.1%} | {f['reused_share']:.1%} | {f['reprocessed']['mean']:,.0f} | "
                    f"{len(f['transitions'])} | {f['unused_share']:.1%} |"
                )
                if stable.bound is not None:
                    b = stable.bound.summary()
                    ratio = result.reprocessed() / max(1, stable.bound.reprocessed())
                    row += (
                        f" {b['reprocessed']['mean']:,.0f} | {b['prefix_share']:.1%} | {b['unused_share']:.1%} |"
                        f" {ratio:.2f} |"
                    )
                print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
