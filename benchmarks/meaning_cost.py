"""Benchmark (issue 46): what recall by meaning costs a turn in ctx itself, and on disk.

A dated story of small talk with scenes (recall_bench's, repeated), its vectors of 384 numbers
(all-MiniLM-L6-v2's size: the stand-in model's 64 of tests/embedder.py, then numbers drawn from
each text's own seed: their cost is measured, not their meaning), then the newest turn built warm, again and
again, with the keyword engine alone and with recall by meaning, in interleaved rounds (this
machine's speed drifts): the medians and their ratio. The query's own embedding request is not
in it (one request of two short texts: about 10 ms to all-MiniLM-L6-v2 on llama-server, -t 1).
It also reports the vectors file's bytes a message.

    python benchmarks/meaning_cost.py                  # 2,000 and 20,000 messages, 5 rounds
    python benchmarks/meaning_cost.py --smoke          # 2,000 messages, 1 round
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DIMENSIONS = 384  # all-MiniLM-L6-v2's
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from embedder import vector_of  # noqa: E402 - the stand-in embedding model
from recall_bench import story as bench_story  # noqa: E402
from recall_bench import with_summaries  # noqa: E402

from otaku_ctx.assemble.steps import Recalled  # noqa: E402
from otaku_ctx.build import Pipeline  # noqa: E402
from otaku_ctx.config import ContextSettings, ModelSettings, Settings  # noqa: E402
from otaku_ctx.embed import texts_of  # noqa: E402
from otaku_ctx.story.meaning import Meaning, Vector, key_of, quantized  # noqa: E402
from otaku_ctx.story.model import Story  # noqa: E402
from otaku_ctx.story.vectors import Vectors, append_vectors  # noqa: E402


def long_story(messages: int) -> Story:
    """recall_bench's story, its weeks repeated to `messages`, each scene an extract with its history."""
    base = bench_story()[0]
    told, scenes = list(base.messages), list(base.scenes)
    while len(told) < messages:
        shift = len(told)
        told += [replace(m, number=m.number + shift, content=f"{m.content} ({shift})") for m in base.messages]
        scenes += [
            replace(s, start=s.start + shift, end=s.end + shift, order=s.order + len(scenes)) for s in base.scenes
        ]
    told, scenes = told[:messages], [s for s in scenes if s.end <= messages]
    return with_summaries(replace(base, messages=tuple(told), scenes=tuple(scenes)), [], "extract")


def dims(text: str, numbers: int = DIMENSIONS) -> Vector:
    """A vector of a real small model's size for `text`: the stand-in's 64 numbers, then numbers
    drawn from the text's own seed (their meaning is not measured here: their cost is)."""
    drawn = random.Random(text)
    return quantized([*vector_of(text), *(drawn.uniform(-0.2, 0.2) for _ in range(numbers - 64))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    sizes, rounds = ((2000,), 1) if args.smoke else ((2000, 20000), 5)
    settings = Settings(
        context=ContextSettings(recall=0.03, cache="stable"), model=ModelSettings(window=8192, tokenizer="cl100k_base")
    )
    for size in sizes:
        told = long_story(size)
        path = Path(tempfile.mkdtemp(prefix="meaning-cost-")) / "v.ctx-vectors"
        texts = texts_of(told)
        append_vectors(path, "stand-in", [(key_of(t), dims(t)) for t in texts])
        vectors = Vectors(path, "stand-in")
        question = next(m.content for m in reversed(told.messages) if m.role == "user")
        meaning = Meaning("stand-in", lambda t, held=vectors: held.get(key_of(t)), dims(question), dims(question[::-1]))
        pipeline = Pipeline(settings)
        meant = replace(told, meaning=meaning)
        pipeline.build(told)  # warm: the word index, the counts
        step = pipeline.build(meant).assembly.steps[-1]
        assert isinstance(step, Recalled) and step.engine == "meaning", step
        times: dict[str, list[float]] = {"keywords": [], "meaning": []}
        for _ in range(rounds):
            fresh = replace(told, meaning=replace(meaning, scored={}))  # a turn's own, as serve makes it
            for name, built in (("keywords", told), ("meaning", fresh)):
                started = time.perf_counter()
                pipeline.build(built)
                times[name].append(time.perf_counter() - started)
        k, m = (statistics.median(times[n]) for n in ("keywords", "meaning"))
        per = (path.stat().st_size - len(path.read_bytes().split(b"\n", 1)[0]) - 1) / len(texts)
        print(
            f"{size:,} messages: a warm build {k * 1000:.0f} ms by keywords, {m * 1000:.0f} ms by meaning"
            f" ({m / k:.2f}x); vectors {per:.0f} bytes a text at {DIMENSIONS} numbers (16 + 1 a number)"
        )
        vectors.close()


if __name__ == "__main__":
    main()
