"""`ctx serve --backend URL`: ctx as an OpenAI-compatible server between the user's frontend
and their model server (docs/serve.md). Parses the flags, makes the service, runs it."""

from __future__ import annotations

import importlib.util
from typing import Annotated

import typer

from .options import ConfigPath, Debug, settings_from
from .terminal import terminal

BackendUrl = Annotated[
    str | None,
    typer.Option("--backend", metavar="URL", help="Your model server's OpenAI-compatible base URL (…/v1)."),
]
Port = Annotated[int | None, typer.Option("--port", min=0, max=65535, help="The port to listen on (default 8765).")]
Host = Annotated[
    str | None,
    typer.Option("--host", metavar="ADDRESS", help="Listen on ADDRESS (default 127.0.0.1; any other needs a key)."),
]
Model = Annotated[
    str | None,
    typer.Option("--model", metavar="NAME", help='The "model" sent on (default: the request\'s).'),
]
NoSummarize = Annotated[bool, typer.Option("--no-summarize", help="Write no scene summaries in the background.")]

#: what `ctx serve --help` ends with
INSTALL = "ctx serve needs aiohttp, the serve extra: pip install 'otaku-ctx[serve]' (sh install.sh installs it)"


def serve_cmd(
    backend: BackendUrl = None,
    port: Port = None,
    host: Host = None,
    model: Model = None,
    no_summarize: NoSummarize = False,
    config: ConfigPath = None,
    debug: Debug = False,
) -> None:
    """Serve an OpenAI-compatible API that assembles each chat to fit your model's window and
    forwards it to your model server; point your frontend at it. Summaries are written in the
    background with the same server, into ~/.otaku/chats/ (docs/serve.md)."""
    from ..errors import OtakuError

    if importlib.util.find_spec("aiohttp") is None:
        raise OtakuError(INSTALL)
    given = {"backend": backend, "port": port, "host": host, "model": model}
    overrides = {f"serve.{k}": (v, f"--{k}") for k, v in given.items() if v is not None}
    if no_summarize:
        overrides["serve.summarize"] = (False, "--no-summarize")
    settings = settings_from(config, overrides)
    from ..serve.http import Service
    from ..serve.listen import serve_forever

    serve_forever(Service(settings), terminal().say, debug=debug)
