"""`ctx serve`: ctx between the user's frontend (SillyTavern, the `openai` client, …) and their
model server, as an OpenAI-compatible server (docs/serve.md).

- `chats`: a request's messages as a Story, and which chat it is;
- `assemble`: the one call from a chat to the messages sent on (`build`);
- `store`: each chat's summaries, in `ctx summarize`'s sidecar format, under ~/.otaku/chats/;
- `summaries`: the summaries written in the background, live requests first;
- `stats`: what each turn sent and the backend reused;
- `upstream`: the requests forwarded to the model server, streamed (aiohttp's client);
- `http`: the server itself (aiohttp), its endpoints, errors and shutdown.

`http` and `upstream` need aiohttp (the `serve` extra); nothing here imports them but the CLI,
after checking that aiohttp is there.
"""

from __future__ import annotations
