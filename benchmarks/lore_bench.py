"""Benchmark: `ctx build` with a 500-entry lorebook against the same build without lore.

    python benchmarks/lore_bench.py                      # 100k messages, 500 entries, 5 runs
    python benchmarks/lore_bench.py --sizes 10000 --entries 500 --engine sillytavern

The story comes from storygen.py; the lorebook is generated from the same vocabulary, so
many entries fire: keys from its places, things and people (one in five with secondary
keys, one in ten a regex, one in ten sticky or on cooldown, a few constant, a few
grouped). Each build is timed as a whole process; the medians and their ratio are printed
(issue 10: the ratio must stay ≤ 1.5).
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


def median_seconds(argv: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000])
    parser.add_argument("--entries", type=int, default=500)
    parser.add_argument("--engine", default="keyword", choices=["keyword", "sillytavern"])
    parser.add_argument("--tokenizer", default="cl100k_base", choices=["cl100k_base", "estimate"])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
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
