"""`ctx embed STORY`: the vectors of STORY's messages and summaries that recall by meaning reads
(`[recall]`, docs/lore.md), written ahead of time beside its summaries — what `ctx serve`
otherwise writes in the player's pauses. Only what the file lacks is asked."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from .options import (
    AsJson,
    ConfigPath,
    Conversation,
    Debug,
    From,
    MaxStorySize,
    StoryArg,
    Summaries,
    named,
    read_story,
    settings_from,
    story_bound,
    summaries_path,
)
from .terminal import progress, terminal, write_stdout

EmbedUrl = Annotated[
    str | None, typer.Option("--url", metavar="URL", help="The embeddings server's base URL ([recall] url).")
]
EmbedModel = Annotated[
    str | None, typer.Option("--model", metavar="NAME", help="The embedding model to ask ([recall] model).")
]


def embed_cmd(
    story: StoryArg,
    url: EmbedUrl = None,
    model: EmbedModel = None,
    as_json: AsJson = False,
    summaries: Summaries = None,
    source_format: From = None,
    conversation: Conversation = None,
    config: ConfigPath = None,
    max_story_size: MaxStorySize = None,
    debug: Debug = False,
) -> None:
    """Embed STORY's messages and summaries with [recall]'s model into the vectors file beside
    its summaries (STORY.<tag>.ctx-vectors); run it again to embed only what is new or edited."""
    from ..embed import embed_story
    from ..errors import UsageError

    given = {"url": url, "model": model}
    settings = settings_from(config, {f"recall.{k}": (v, f"--{k}") for k, v in given.items() if v is not None})
    if not settings.recall.on:
        raise UsageError("--url", None, "no embedding model: set [recall] url and model, or --url and --model")
    story = named(story, "STORY", "an empty path; name the story file")
    if story == "-":
        raise UsageError("STORY", None, "a story read from stdin has nowhere to keep its vectors; name the file")
    sidecar = summaries_path(story, named(summaries, "--summaries", "an empty path; name a summaries file"))
    fmt = source_format.value if source_format else None
    told = read_story(story, fmt, (), conversation, story_bound(max_story_size), str(sidecar) if sidecar else "none")
    with progress(terminal()) as phase:
        phase(f"embedding the texts of {told.path}")
        path, texts, done = embed_story(told, settings.recall, sidecar, lambda w: phase(f"embedded {w.embedded:,}"))
    facts = {"vectors": str(path), "texts": texts, "had": done.had, "embedded": done.embedded}
    if as_json:
        write_stdout(json.dumps(facts | {"requests": done.requests, "seconds": done.seconds}) + "\n")
        return
    write_stdout(
        f"{done.embedded:,} texts embedded in {done.requests:,} requests ({done.seconds:g} s); "
        f"{done.had:,} had their vector already: {path}\n"
    )
