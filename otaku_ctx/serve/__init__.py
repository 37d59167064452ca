"""`ctx serve`: ctx between the user's frontend (SillyTavern, the `openai` client, …) and their
model server, as an OpenAI-compatible server (docs/serve.md).

A chat request passes its stages, one module each, wired by `http.Service`:
- `body`: the request's body, read within its bounds and decoded;
- `request`: the request checked whole (every message) before any state changes;
- `turn`: on a worker thread (`setup`), the chat's session taken (`sessions`), its story, scenes
  (`store`) and frame (`frame`) read, and the turn assembled (`assemble`);
- `relay`: the assembled request sent on (`upstream`) and its reply passed back, whole or streamed;
- `record`: the turn's log line, its stats (`stats`), a refusal's words.
A chat's state lives on its `session.Session`, in parts that each own their fields and lock;
`summaries` writes the summaries in the background, live requests first; `errors` is every
failure a request can get, each with its status; `listen` runs the server until it is stopped.

`http`, `body`, `relay`, `listen`, `setup` and `upstream` need aiohttp or asyncio (the `serve`
extra); nothing imports them but the CLI, after checking that aiohttp is there.
"""

from __future__ import annotations
