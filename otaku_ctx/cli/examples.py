"""The end of each command's `--help`: one or two examples. Those that need no model server
name the bundled examples, so they run as written from a clone (tests/test_cli_examples.py
runs every one of them)."""

from __future__ import annotations

STORY = "examples/lighthouse-case4.jsonl"  # a native story with its scenes' summaries
CHAT = "examples/lighthouse-chat.jsonl"  # a chat with no summaries yet
SERVER = "http://127.0.0.1:8080/v1"


def examples(*lines: str) -> str:
    """An epilog: each line printed as written (click's `\\b` keeps it from being rewrapped)."""
    return "Examples:\n\n\b\n" + "\n".join(f"  {line}" for line in lines) + "\n"


EXAMPLES = {
    "build": examples(
        f"ctx build {STORY} --window 8192",
        f"ctx build {STORY} --emit openai-chat -o body.json",
    ),
    "inspect": examples(
        f"ctx inspect {STORY} --window 4096 --explain",
        f"ctx inspect {STORY} --json",
    ),
    "validate": examples(f"ctx validate {STORY}"),
    "convert": examples(f"ctx convert {CHAT} -o story.jsonl"),
    "replay": examples(
        f"ctx replay {STORY} --window 4096 --cache stable",
        f"ctx replay {STORY} --window 4096 --last 120 --bound",
    ),
    "summarize": examples(
        f"ctx summarize {CHAT} --dry-run   # no server",
        f"ctx summarize chat.jsonl --url {SERVER} --model smol",
    ),
    "scenes": examples(
        f"ctx scenes {STORY}",
        f"ctx scenes {STORY} --show 4",
        f"ctx scenes chat.jsonl --redo 4-6 --url {SERVER} --model smol",
    ),
    "embed": examples(
        "llama-server -m embedder.gguf --embeddings --port 8081 &",
        "ctx embed chat.jsonl --url http://127.0.0.1:8081/v1 --model embedder",
    ),
    "serve": examples(
        "llama-server -m model.gguf -c 8192 &",
        f"ctx serve --backend {SERVER}",
        "# SillyTavern: Chat Completion, Custom, URL http://127.0.0.1:8765/v1",
    ),
    "config init": examples("ctx config init   # every setting, documented"),
    "config show": examples("ctx config show   # each setting and where it came from"),
    "template vars": examples(f"ctx template vars {STORY} > vars.json"),
    "template render": examples(
        f"ctx template vars {STORY} > vars.json",
        "ctx template render default --vars vars.json",
    ),
}
