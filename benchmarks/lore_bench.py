"""Benchmark: `ctx build` with a 500-entry lorebook against the same build without lore, and
lore's worst cases (issue 20).

    python benchmarks/lore_bench.py                      # 100k messages, 500 entries, 5 runs
    python benchmarks/lore_bench.py --sizes 10000 --entries 500 --engine sillytavern
    python benchmarks/lore_bench.py --worst              # each worst case, median of 5 runs
    python benchmarks/lore_bench.py --worst --only chain-1000 --code /tmp/old --runs 1 --timeout 300
    python benchmarks/lore_bench.py --smoke              # once, small: 1,000 messages, 1 run
    python benchmarks/lore_bench.py --worst --smoke      # once: three of the worst cases, 1 run

The story comes from storygen.py; the lorebook is generated from the same vocabulary, so
many entries fire: keys from its places, things and people (one in five with secondary
keys, one in ten a regex, one in ten sticky or on cooldown, a few constant, a few
grouped). Each build is timed as a whole process; the medians and their ratio are printed
(issue 10: the ratio must stay ≤ 1.5).

`--worst` builds what issue 20 measured, each as a whole `ctx build` process: a regex key
that backtracks catastrophically on every message plus one sticky entry (so 200 turns are
replayed), recursion chains of 1,000 and 3,000 entries (each entry's content names the
next one's key), 5,000 entries plus one sticky entry (both engines), and the keyword engine
ranking 20,000 and 40,000 entries all mentioned in its window. Each must stay under 5 s.
`--code DIR` runs another checkout's `otaku_ctx` (e.g. `git archive` of an older commit),
`--timeout` stops a run that takes longer and prints it as "> N s".

`--smoke` (benchmarks/smoke.sh) runs once at a small size, to show the benchmark still works:
a 1,000-message story, one run; with `--worst`, one run of regex+sticky, chain-1000 and
5000+sticky (keyword) (each kind of case at its smallest, but the mentioned entries: 4 s at
20,000), stopped after 30 s. A ctx run that fails ends the script with a non-zero exit, as in
a full run; under `--smoke` one stopped at the timeout does too.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import storygen  # noqa: E402


def lorebook(entries: int, seed: int = 11) -> dict[str, object]:
    rng = random.Random(seed)
    words = storygen.PLACES + storygen.THINGS + storygen.PEOPLE
    book: dict[str, object] = {}
    for uid in range(entries):
        key = rng.choice(words).removeprefix("the ").removeprefix("a ")
        entry: dict[str, object] = {
            "uid": uid,
            "key": [key, f"{key} {uid}"],
            "content": storygen.paragraph(rng, rng.randint(1, 4)),
            "order": rng.randint(1, 300),
            "position": rng.choice([0, 0, 1, 1, 4]),
            "depth": rng.randint(0, 6),
        }
        if uid % 5 == 1:
            entry["keysecondary"] = [rng.choice(storygen.PEOPLE)]
            entry["selectiveLogic"] = rng.randint(0, 3)
        if uid % 10 == 2:
            entry["key"] = [f"/{key.split()[0]}s?/i"]
        if uid % 10 == 3:
            entry["sticky" if uid % 20 == 3 else "cooldown"] = rng.randint(1, 5)
        if uid % 50 == 4:
            entry["constant"] = True
        if uid % 25 == 5:
            entry["group"] = f"g{uid % 3}"
            entry["probability"] = 60
        book[str(uid)] = entry
    return {"entries": book}


def median_seconds(argv: list[str], runs: int, code: str | None = None, timeout: float | None = None) -> float:
    """The median wall time of `runs` runs (of the otaku_ctx in the folder `code`, when
    given); infinity when a run takes longer than `timeout`."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        try:
            subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=code, timeout=timeout)
        except subprocess.TimeoutExpired:
            return float("inf")
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# ── Issue 20's worst cases ────────────────────────────────────────────────────────────────

Case = tuple[list[dict[str, object]], dict[str, object], str]  # story records, lorebook, config


def message(i: int, content: str) -> dict[str, object]:
    return {"role": "user" if i % 2 else "assistant", "name": "Mara" if i % 2 else "Ilya", "content": content}


def regex_sticky() -> Case:
    """A regex key that backtracks catastrophically on every message, and one sticky entry:
    the sticky replay scans 200 earlier turns, each in several passes."""
    story = [message(i, f"The tide turns. {'a' * 40}! The bell rings {i}.") for i in range(1, 401)]
    book = {
        "0": {"uid": 0, "key": ["/(a|aa)+$/"], "content": "Backtracking."},
        "1": {"uid": 1, "key": ["bell"], "content": "The bell is sticky.", "sticky": 200},
    }
    return story, {"entries": book}, '[lore]\nengine = "sillytavern"\n'


def chain(n: int) -> Case:
    """n entries, each one's content naming the next one's key: n recursion passes."""
    story = [message(i, f"Line {i} of the story.") for i in range(1, 10)] + [message(10, "We follow link0.")]
    book = {str(i): {"uid": i, "key": [f"link{i}"], "content": f"Link {i} leads on to link{i + 1}."} for i in range(n)}
    return story, {"entries": book}, '[lore]\nengine = "sillytavern"\nbudget = 100\n'


def sticky_book(n: int, engine: str) -> Case:
    """n generated entries (many fire on every turn) and one sticky entry: 200 turns replayed."""
    book = lorebook(n)
    entries = book["entries"]
    assert isinstance(entries, dict)
    for entry in entries.values():  # only the one sticky entry has a timed effect
        entry.pop("sticky", None)
        entry.pop("cooldown", None)
    entries[str(n)] = {"uid": n, "key": ["bell"], "content": "The bell is sticky.", "sticky": 200}
    return storygen.records(1000), book, f'[lore]\nengine = "{engine}"\n'


def mentioned(n: int) -> Case:
    """The keyword engine with n entries, every one of them mentioned in its 10-message window."""
    words = [f"word{i}" for i in range(n)]
    per = len(words) // 10 + 1
    story = [message(i, "Nothing yet.") for i in range(1, 11)]
    story += [message(11 + j, " ".join(words[j * per : (j + 1) * per])) for j in range(10)]
    book = {str(i): {"uid": i, "key": [w], "content": f"Entry {i}."} for i, w in enumerate(words)}
    return story, {"entries": book}, '[lore]\nengine = "keyword"\n'


# --worst --smoke: each kind of case at its smallest, but the mentioned entries (4 s at 20k)
SMOKE_WORST = ("regex+sticky", "chain-1000", "5000+sticky (keyword)")

# name -> (the case, the window it is built for)
WORST: dict[str, tuple[Callable[[], Case], int]] = {
    "regex+sticky": (regex_sticky, 32768),
    "chain-1000": (lambda: chain(1000), 400_000),
    "chain-3000": (lambda: chain(3000), 400_000),
    "5000+sticky (sillytavern)": (lambda: sticky_book(5000, "sillytavern"), 8192),
    "5000+sticky (sillytavern, 400k)": (lambda: sticky_book(5000, "sillytavern"), 400_000),
    "5000+sticky (keyword)": (lambda: sticky_book(5000, "keyword"), 8192),
    "keyword 20k mentioned": (lambda: mentioned(20_000), 400_000),
    "keyword 40k mentioned": (lambda: mentioned(40_000), 400_000),
}


def worst(args: argparse.Namespace) -> int:
    code = f", code {args.code}" if args.code else ""
    print(f"lore's worst cases, tokenizer {args.tokenizer}, median of {args.runs} runs{code}")
    print(f"{'case':<34}  {'seconds':>8}  placed")
    timed_out = False
    with tempfile.TemporaryDirectory() as tmp:
        for n, (name, (make, window)) in enumerate(WORST.items()):
            if args.only and not any(o in name for o in args.only):
                continue
            if args.smoke and not args.only and name not in SMOKE_WORST:
                continue
            story, book, config = make()
            folder = Path(tmp) / str(n)
            folder.mkdir()
            storygen.write(folder / "story.jsonl", story)
            (folder / "book.json").write_text(json.dumps(book))
            (folder / "config.toml").write_text(config)
            inputs = [
                str(folder / "story.jsonl"),
                "--lore",
                str(folder / "book.json"),
                "--config",
                str(folder / "config.toml"),
            ]
            flags = ["--tokenizer", args.tokenizer, "--window", str(window)]
            ctx = [sys.executable, "-m", "otaku_ctx"]
            seconds = median_seconds([*ctx, "build", *inputs, *flags], args.runs, args.code, args.timeout)
            placed = "-"
            if seconds != float("inf"):
                facts = subprocess.run(
                    [*ctx, "inspect", *inputs, *flags, "--json"], capture_output=True, text=True, cwd=args.code
                )
                placed = str(sum(e["placed"] for e in json.loads(facts.stdout)["lore"]["entries"]))
            shown = f"> {args.timeout:g}" if seconds == float("inf") else f"{seconds:.2f}"
            print(f"{name:<34}  {shown:>8}  {placed}", flush=True)
            if args.smoke and seconds == float("inf"):
                timed_out = True
    return 1 if timed_out else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", help="story sizes in messages (default 100000)")
    parser.add_argument("--entries", type=int, default=500)
    parser.add_argument("--engine", default="keyword", choices=["keyword", "sillytavern"])
    parser.add_argument("--tokenizer", default="cl100k_base", choices=["cl100k_base", "estimate"])
    parser.add_argument("--runs", type=int, help="runs per figure, the median reported (default 5)")
    parser.add_argument("--worst", action="store_true", help="time issue 20's worst cases instead")
    parser.add_argument("--only", nargs="+", help="with --worst: only the cases whose names contain one of these")
    parser.add_argument("--code", help="with --worst: the folder holding the otaku_ctx to run (default: this one)")
    parser.add_argument("--timeout", type=float, default=None, help="with --worst: stop a run after this long")
    parser.add_argument("--smoke", action="store_true", help="once, small: 1,000 messages, 1 run")
    args = parser.parse_args()
    if args.sizes is None:
        args.sizes = [1_000] if args.smoke else [100_000]
    if args.runs is None:
        args.runs = 1 if args.smoke else 5
    if args.smoke and args.timeout is None:
        args.timeout = 30.0
    if args.worst:
        return worst(args)
    print(f"{args.entries} entries, engine {args.engine}, tokenizer {args.tokenizer}, median of {args.runs} runs")
    print(f"{'messages':>9}  {'no lore':>8}  {'lore':>8}  {'ratio':>5}  placed")
    with tempfile.TemporaryDirectory() as tmp:
        book = Path(tmp) / "book.json"
        book.write_text(json.dumps(lorebook(args.entries)))
        config = Path(tmp) / "config.toml"
        config.write_text(f'[lore]\nengine = "{args.engine}"\n')
        for n in args.sizes:
            path = Path(tmp) / f"story-{n}.jsonl"
            storygen.write(path, storygen.records(n))
            base = [sys.executable, "-m", "otaku_ctx", "build", str(path), "--tokenizer", args.tokenizer]
            base += ["--config", str(config)]
            plain = median_seconds(base, args.runs)
            lore = median_seconds([*base, "--lore", str(book)], args.runs)
            facts = subprocess.run(
                [*base[:3], "inspect", *base[4:], "--lore", str(book), "--json"], capture_output=True, text=True
            )
            placed = sum(e["placed"] for e in json.loads(facts.stdout)["lore"]["entries"])
            print(f"{n:>9,}  {plain:>7.2f}s  {lore:>7.2f}s  {lore / plain:>5.2f}  {placed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
