"""Drive otaku 0.8's own prompt assembler on a benchmark story. Runs under otaku's venv.

    <otaku-venv>/bin/python benchmarks/otaku_adapter.py export story.jsonl story.md
    <otaku-venv>/bin/python benchmarks/otaku_adapter.py build story.md --head 20 --tail 150 --window 8192

`export` turns a native JSONL story (as storygen.py writes it) into otaku's Markdown export,
written by otaku's own `render_story`, so the file is exactly what otaku reads. `build` is the
process the benchmark times: it reads that export with otaku's own `parse_story`, lays the
story out as otaku's store would hand it over (messages numbered 1..N, scenes by message id),
runs `otaku.context.assembler.assemble_story` — the one door of otaku's turn and of its
`/context` preview — and prints the prompt (the system message and the story text) on stdout.

What is left out, and why: otaku's SQLite store and app launch (`open_app`) are not timed.
An otaku user's story already lives in the store; ctx reads a file. Timing otaku from its
export file through its assembler is the like-for-like comparison: both start from a file
and end with a prompt. The store is stood in for by the three calls the assembler makes.
otaku counts tokens as len/4 (`estimate_tokens`); it has no tokenizer and no templates.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def export(story: Path, out: Path) -> None:
    from otaku import __version__
    from otaku.backend.domain._formats import ExportedMessage, ExportedScene, ExportedStory
    from otaku.backend.domain._formats.exports import render_story

    title, system, user = "", [], None
    messages: list[ExportedMessage] = []
    scenes: list[ExportedScene] = []
    with story.open(encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            kind = record.get("type")
            if kind == "story":
                title, user = record.get("title", ""), record.get("user")
            elif kind == "scene":
                scenes.append(
                    ExportedScene(
                        span=(record["start"], record["end"]),
                        title=record.get("title", ""),
                        summary=record.get("summary", ""),
                        history=record.get("history", ""),
                    )
                )
            elif kind == "card":
                body = "\n\n".join(str(record[k]) for k in ("description", "personality") if record.get(k))
                messages.append(ExportedMessage(role="user", body=body, kind="card", speaker=record["name"]))
            elif record.get("role") == "system" and not messages:
                system.append(record["content"])
            else:
                speaker = record.get("name") if record["role"] == "user" else None
                messages.append(ExportedMessage(role=record["role"], body=record["content"], speaker=speaker))
    text = "\n\n".join(system)
    if user:
        text = text.replace("{{user}}", user)
    scenes.sort(key=lambda s: s.span or (0, 0))
    document = ExportedStory(title=title, system=text, scenes=tuple(scenes), messages=tuple(messages))
    out.write_text(
        render_story(document, otaku_version=__version__, model="benchmark", exported="2026-01-01 00:00"),
        encoding="utf-8",
    )


class _Scenes:
    def __init__(self, scenes):
        self._scenes = scenes

    def get_current(self, story_id, message_ids):
        return self._scenes


class _Characters:
    def list(self, story_id):
        return []


class _Store:
    """The three reads `assemble_story` makes of otaku's store, answered from the export."""

    def __init__(self, scenes):
        self.scenes = _Scenes(scenes)
        self.characters = _Characters()
        self.files = None  # only read for pictures, and PicturesRide.NONE reads none


def build(path: Path, head: int, tail: int, window: int) -> int:
    from otaku.backend.domain._formats.imports import parse_story
    from otaku.context import assembler, tool_calls
    from otaku.settings.prompts import Prompts
    from otaku.store.schema import Message, Scene

    document = parse_story(path.read_text(encoding="utf-8"))
    if document is None:
        print(f"{path}: not an otaku export", file=sys.stderr)
        return 1
    messages = [
        Message(role=m.role, body=m.body, kind=m.kind, template=m.template, speaker=m.speaker, id=number)
        for number, m in enumerate(document.messages, start=1)
    ]
    scenes = [
        Scene(id=n, start_message_id=s.span[0], end_message_id=s.span[1], summary=s.summary, history=s.history)
        for n, s in enumerate(document.scenes, start=1)
        if s.span is not None
    ]
    shape = assembler.ContextShape(
        head_messages=head,
        min_tail_messages=tail,
        context_in_force=assembler.context_in_force(window, 0),
    )
    try:
        prompt = assembler.assemble_story(
            _Store(scenes),
            1,
            system=document.system,
            messages=messages,
            injections=(),
            tool_set=tool_calls.ToolSet(),
            prompts=Prompts(),
            shape=shape,
        )
    except assembler.ContextOverflowError as e:
        print(str(e), file=sys.stderr)
        return 3
    out = sys.stdout
    if prompt.system:
        out.write(prompt.system + "\n\n")
    out.write(prompt.as_story_text())
    print(
        f"otaku: {prompt.total_tokens} tokens (estimate) of {prompt.limit}; head {prompt.head}, "
        f"summaries {prompt.scenes_summarized}, history {prompt.history}, tail {prompt.tail}",
        file=sys.stderr,
    )
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    e = commands.add_parser("export")
    e.add_argument("story", type=Path)
    e.add_argument("out", type=Path)
    b = commands.add_parser("build")
    b.add_argument("export", type=Path)
    b.add_argument("--head", type=int, default=20)
    b.add_argument("--tail", type=int, default=150)
    b.add_argument("--window", type=int, default=8192)
    args = parser.parse_args(argv)
    if args.command == "export":
        export(args.story, args.out)
        return 0
    return build(args.export, args.head, args.tail, args.window)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
