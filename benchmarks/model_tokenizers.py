"""Times the model counters of `otaku_ctx.model.hf` and `.spm` (issues 18 and 26): a GGUF's metadata
read, its vocabulary converted to a `tokenizers` tokenizer (the first build with that model),
the converted tokenizer loaded from the cache (every later build), and counting a story's
texts beside the cl100k_base counter, one by one and in batches.

    .venv/bin/python benchmarks/model_tokenizers.py [--gguf FILE] [--story FILE.jsonl] [--vocab N]
    .venv/bin/python benchmarks/model_tokenizers.py --smoke [--gguf FILE]   # once, small (smoke.sh)

Without --gguf it writes a synthetic byte-level BPE GGUF of --vocab tokens (default 128,256,
Llama 3's size) with merges consistent with them (178k; Llama 3 has 280k); --gguf times a real one (SmolLM2's, say).
Each figure is CPU time (these machines are shared: wall time drifts with the load), the median
of --rounds fresh processes; "convert" is a first build's, "cached load" a later build's.
--smoke is one round, and without --gguf a synthetic vocabulary of 8,192 tokens.

Figures on this machine (2 shared cores, Python 3.11, tokenizers 0.23.3, TOKENIZERS_PARALLELISM
false), CPU seconds, medians of 5, a 1,052-message story (1,001 texts):

    synthetic, 128,256 tokens, 178k merges:  imports + metadata 0.052 s; convert 0.95 s (the
        first build only); cached load 0.29 s; counting 0.028 s one by one, 0.023 s in batches,
        against cl100k_base's 0.0056 s (4.9x, 4.2x).
    SmolLM2, 49,152 tokens, 48,900 merges:   imports + metadata 0.026 s; convert 0.19 s; cached
        load 0.063 s; counting 0.023 s, 0.020 s, against 0.0052 s (4.4x, 3.8x).

Nearly all of the counting time is the pre-tokenizer's regex (`tokenizers` runs it with
Oniguruma); the whole build is what a user waits for: `ctx build` of that story with
`--tokenizer` SmolLM2's GGUF takes 0.31 s against cl100k_base's 0.26 s (1.2x, whole process).

A SentencePiece GGUF (`model/spm.py`, ctx's own code; nothing converted or cached, so "convert"
and "cached load" are both its vocabulary read) and Gemma 4's BPE, on the 419 texts of
examples/lighthouse-case4.jsonl as it is now, medians of 3 (Gemma 4: one round; issue 26):

    llama.cpp's ggml-vocab-llama-spm.gguf, 32,000 tokens: imports + metadata 0.053 s; load
        0.12-0.17 s; counting 0.0081 s one by one, 0.0082 s in batches, against cl100k_base's
        0.0038 s (2.1x). A 1,000-message `ctx build` (benchmarks/bench.py --counters): 0.68 s
        against cl100k_base's 0.75 s (0.90x); Phi-3's vocabulary 0.84 s (1.13x).
    ggml-vocab-gemma-4.gguf, 262,144 tokens, 514,906 merges: convert 6.2 s; cached load 1.5 s;
        counting 0.012 s, 0.0095 s, against 0.0027 s (4.3x, 3.5x).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]

ROUND = r"""
import json, os, sys, time
clock = time.process_time
from pathlib import Path
t0 = clock()
from otaku_ctx.model.gguf import read_gguf
from otaku_ctx.model.hf import gguf_counter
model = read_gguf(Path(sys.argv[1]))
t1 = clock()
counter = gguf_counter(Path(sys.argv[1]), model)
counter.loaded()
t2 = clock()
texts = [json.loads(line).get("content", "") for line in open(sys.argv[2], encoding="utf-8")]
texts = [t for t in texts if t]
one = gguf_counter(Path(sys.argv[1]), model); one.loaded()
t3 = clock(); total = sum(one(t) for t in texts); t4 = clock()
many = gguf_counter(Path(sys.argv[1]), model); many.loaded()
t5 = clock(); assert sum(many.count_many(texts)) == total; t6 = clock()
from otaku_ctx.tokens import make_counter
cl = make_counter("cl100k_base")
t7 = clock(); sum(cl(t) for t in texts); t8 = clock()
print(json.dumps({"read": t1 - t0, "load": t2 - t1, "one": t4 - t3, "batch": t6 - t5, "cl100k": t8 - t7,
                  "texts": len(texts), "tokens": total}))
"""


def synthetic(path: Path, size: int, seed: int = 1) -> Path:
    """A byte-level BPE GGUF of `size` tokens whose merges are consistent with it."""
    from gguf_files import I32, array, byte_alphabet, write_gguf

    rng = random.Random(seed)
    tokens = ["<|begin_of_text|>", "<|end_of_text|>", *byte_alphabet()]
    known = set(tokens)
    merges: list[str] = []
    letters = list("etaoinshrdlu")  # few letters: most splits of a token are tokens too, as in real ones
    pool = letters + ["Ġ"] * 4
    while len(tokens) < size:
        a = rng.choice(pool) if rng.random() < 0.3 else tokens[rng.randrange(2, len(tokens))]
        b = rng.choice(letters) if rng.random() < 0.7 else tokens[rng.randrange(2, len(tokens))]
        joined = a + b
        if len(joined) > 16 or " " in joined:
            continue
        merges.append(f"{a} {b}")
        if joined not in known:
            known.add(joined)
            tokens.append(joined)
            pool.append(joined)
    made, seen = tokens[258:], set(merges)
    for _ in range(40 * size):  # other splits of tokens already there, as Llama 3's merges hold
        if len(seen) >= int(2.2 * size):
            break
        token = rng.choice(made)
        cut = rng.randint(1, len(token) - 1)
        merge = f"{token[:cut]} {token[cut:]}"
        if token[:cut] in known and token[cut:] in known and merge not in seen:
            seen.add(merge)
            merges.append(merge)
    merges = list(dict.fromkeys(merges))
    metadata = {
        "general.architecture": "llama",
        "llama.context_length": 131072,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "llama-bpe",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": array(I32, [3, 3] + [1] * (len(tokens) - 2)),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1,
    }
    return write_gguf(path, metadata)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gguf", type=Path)
    parser.add_argument("--story", type=Path, default=HERE.parent / "examples" / "lighthouse-case4.jsonl")
    parser.add_argument("--vocab", type=int, help="the synthetic vocabulary's size (default 128256)")
    parser.add_argument("--rounds", type=int, help="fresh processes, the median reported (default 5)")
    parser.add_argument("--smoke", action="store_true", help="once, small: 1 round, a vocabulary of 8192")
    args = parser.parse_args()
    if args.vocab is None:
        args.vocab = 8_192 if args.smoke else 128_256
    if args.rounds is None:
        args.rounds = 1 if args.smoke else 5
    with tempfile.TemporaryDirectory(prefix="ctx-model-bench-") as folder:
        gguf = args.gguf or synthetic(Path(folder) / "synthetic.gguf", args.vocab)
        runs = []
        for round_ in range(args.rounds):
            home = Path(folder) / f"home-{round_}"
            env = {"OTAKU_HOME": str(home), "PATH": "/usr/bin:/bin", "TOKENIZERS_PARALLELISM": "false"}
            command = [sys.executable, "-c", ROUND, str(gguf), str(args.story)]
            # the first run of a fresh home converts the vocabulary; the second loads the cache
            done = [subprocess.run(command, env=env, capture_output=True, text=True) for _ in range(2)]
            for child in done:
                if child.returncode:
                    sys.exit(f"a round's process exited {child.returncode}:\n{child.stderr.strip()}")
            first, again = done
            runs.append((json.loads(first.stdout), json.loads(again.stdout)))
        first = {k: statistics.median(r[0][k] for r in runs) for k in runs[0][0]}
        cached = {k: statistics.median(r[1][k] for r in runs) for k in runs[0][1]}
        print(f"{gguf.name}: {first['texts']:.0f} texts, {first['tokens']:.0f} tokens")
        print(
            f"  imports + metadata {first['read']:.3f} s; convert (first build) {first['load']:.3f} s;"
            f" cached load {cached['load']:.3f} s"
        )
        print(
            f"  counting: one by one {cached['one']:.4f} s, batches {cached['batch']:.4f} s,"
            f" cl100k_base {cached['cl100k']:.4f} s"
            f" ({cached['one'] / cached['cl100k']:.2f}x and {cached['batch'] / cached['cl100k']:.2f}x)"
        )


if __name__ == "__main__":
    main()
