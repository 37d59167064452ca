"""`--tokenizer server`: the model server's own tokenize endpoint as a counter, exact by
definition, with a persistent count cache so that a rebuild asks only for what is new.

The server is asked through `backend.Backend` (llama.cpp, vLLM, KoboldCpp, TabbyAPI: see
`backend/servers.py`): each text as the server parses a prompt (special tokens parsed, no
BOS), once. What the server adds to a whole prompt is learned once per server model (a short
text counted with and without its additions) and kept in the same cache. For `ctx build`
nothing falls back: a server that does not answer, or has no tokenize endpoint, is a one-line
error. `ctx serve` gives its counter a fallback (`fall_back`): a turn whose count the server
fails (an error status, a reply with no count, a timeout) is counted by the fallback with a
margin, and answered.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from ..backend import Backend, BackendError, NoTokenizer
from ..backend.servers import LLAMA_CPP
from ..tokens import TokenCounter
from .counts import CountStore, meta_key, text_key

#: the text whose count with and without the server's additions tells what it adds
PROBE = "Hello"
#: requests in flight at once when many new texts are counted together (`count_many`)
JOBS = 4
#: the chats whose templated count is kept (a turn confirms a few candidates)
MOST_CHATS = 256
#: while the server fails to count, the fallback's count is raised by this share (`fall_back`)
MARGIN = 0.1
#: the most characters one batched tokenize request carries (`count_many`)
BATCH_CHARACTERS = 1_000_000
#: texts whose counts in a batch must be their counts alone before the server's batches are
#: believed (`_joins`): blanks and line ends at both ends, where a control token that strips the
#: blanks beside it would take some
JOIN_PROBE = (" a ", "b\n", "\n\n c", "d", "  ")
#: the chat whose templated count, against its first two messages', tells what a message costs
#: beyond its content (`ServerCounter.chat_overhead`)
CALIBRATION = (
    {"role": "system", "content": "You are Seraphina, the guardian of the glade."},
    {"role": "user", "content": "Hello there. Where am I?"},
    {"role": "assistant", "content": '*She smiles softly.* "You are safe here."'},
    {"role": "user", "content": "Thank you."},
)


class ServerCounter(TokenCounter):
    """A `TokenCounter` that asks the server, through the count cache."""

    def __init__(
        self, backend: Backend, store: CountStore, name: str, specials: tuple[str, ...], bos: str, separator: str = ""
    ) -> None:
        self.backend = backend
        self.store = store
        self.separator = separator  # a control token the server cuts a text at (its EOS): `count_many`'s batches
        added = self._what_it_adds()
        # `bos`: the BOS the server adds itself, so a text prompt does not spell it too; none when it adds none
        super().__init__(
            name, self._one, specials=specials, bos=bos if added else "", added=added, parses_specials=True
        )
        self._chats: dict[str, int] | Literal[False] = {}  # False: the server applies no template on request
        self._overhead: tuple[int, int] | Literal[False] | None = None
        self._local: TokenCounter | None = None  # what counts while the server fails (`fall_back`)
        self._told: Callable[[str], None] = lambda why: None
        self.failing = ""  # why the server failed to count this turn ("" while it counts)

    def fall_back(self, local: TokenCounter, told: Callable[[str], None]) -> None:
        """`ctx serve`'s: when the server fails to count (`BackendError`: an error status, a
        reply with no count, a timeout, gone), count with `local` raised by `MARGIN` for the
        rest of the turn, the server's counts kept before kept, and tell `told` why. The next
        turn asks the server again (`afresh`): one failed call a turn, not one a text."""
        self._local, self._told = local, told

    def afresh(self) -> None:
        """A new turn: after a turn that fell back, the server is asked again, and the estimates
        made meanwhile are forgotten (an exact count replaces each)."""
        if self.failing:
            self.failing = ""
            self.forget()

    @contextmanager
    def _or_fall_back(self) -> Iterator[None]:
        """What the server is asked in it: a failure (`BackendError`; not "no tokenize endpoint",
        which is the server's nature, not a failure) raised, or with a fallback, taken for the
        turn (`failing` said) and the block left."""
        try:
            yield
        except NoTokenizer:
            raise
        except BackendError as why:
            if self._local is None:
                raise
            self.failing = str(why)
            self._told(self.failing)

    def _estimate(self, text: str) -> int:
        assert self._local is not None
        return math.ceil(self._local(text) * (1 + MARGIN))

    def _what_it_adds(self) -> int:
        key = meta_key("added")
        found = self.store.get(key)
        if found is None:
            found = max(0, self.backend.count(PROBE, add_special=True) - self.backend.count(PROBE))
            self.store.add({key: found})
        return found

    def _one(self, text: str) -> int:
        key = text_key(text)
        found = self.store.get(key)
        if found is not None:
            return found
        if not self.failing:
            with self._or_fall_back():
                found = self.backend.count(text)
                self.store.add({key: found})
                return found
        return self._estimate(text)

    def chat(self, messages: Sequence[Mapping[str, Any]]) -> int | None:
        """The chat as the server's template gives it to the model, counted by the server
        (`Backend.chat_count`: llama.cpp's `/apply-template`); None where it cannot say. Each
        distinct chat is asked once while it is recent (a turn's candidates are confirmed by
        it)."""
        if self._chats is False or self.failing:
            return None
        key = json.dumps(messages, ensure_ascii=False, sort_keys=True)
        found = self._chats.get(key)
        if found is None:
            asked = None
            with self._or_fall_back():
                asked = self.backend.chat_count([dict(m) for m in messages])
            if self.failing:
                return None
            if asked is None:
                self._chats = False
                return None
            found = self._chats[key] = asked
            while len(self._chats) > MOST_CHATS:
                del self._chats[next(iter(self._chats))]
        return found

    @property
    def chat_overhead(self) -> tuple[int, int] | None:
        """Measured once on a chat of four messages and its first two (`CALIBRATION`): a
        message's tokens beyond its content's, and the prompt's beyond its messages'."""
        if self._overhead is None:
            two, four = self.chat(CALIBRATION[:2]), self.chat(CALIBRATION)
            if self.failing:  # not measured this turn: asked again the next
                return None
            if two is None or four is None:
                self._overhead = False
            else:
                contents = [self(m["content"]) for m in CALIBRATION]
                per = max(0, -(-(four - two - contents[2] - contents[3]) // 2))
                self._overhead = (per, max(0, two - contents[0] - contents[1] - 2 * per))
        return self._overhead or None

    def count_many(self, texts: Iterable[str]) -> list[int]:
        """The counts of many texts; those the cache lacks are asked in batches (`batched`: one
        request for up to `BATCH_CHARACTERS` of them, where the server's batches hold), else
        `JOBS` at a time (each distinct text once), and kept, so that `self(text)` then asks
        nothing. A failure with a fallback (`fall_back`) leaves them to it."""
        texts = list(texts)
        keys = [text_key(text) for text in texts]
        missing = {key: text for key, text in zip(keys, texts, strict=True) if self.store.get(key) is None}
        if missing and not self.failing:
            with self._or_fall_back():
                asked = self.batched(list(missing.values())) if len(missing) > 1 and self._joins() else None
                if asked is None and len(missing) == 1:
                    asked = [self.backend.count(next(iter(missing.values())))]
                elif asked is None:
                    with ThreadPoolExecutor(min(JOBS, len(missing))) as pool:
                        asked = list(pool.map(self.backend.count, missing.values()))
                self.store.add(dict(zip(missing, asked, strict=True)))
        return [self(text) for text in texts]

    def batched(self, texts: Sequence[str]) -> list[int] | None:
        """`texts`' counts, a request for each `BATCH_CHARACTERS` of them joined by the separator
        (`Backend.count_each`), a text that spells the separator asked alone; None when the
        server cannot count so."""
        counted: dict[int, int] = {}
        batch: list[int] = []
        size = 0
        for at, text in enumerate([*texts, None]):
            if text is not None and self.separator in text:
                counted[at] = self.backend.count(text)
                continue
            if batch and (text is None or size + len(text) > BATCH_CHARACTERS):
                found = self.backend.count_each([texts[i] for i in batch], self.separator)
                if found is None:
                    return None
                counted.update(zip(batch, found, strict=True))
                batch, size = [], 0
            if text is not None:
                batch.append(at)
                size += len(text) + len(self.separator)
        return [counted[at] for at in range(len(texts))]

    def _joins(self) -> bool:
        """Whether the server counts each text of a batch as it counts it alone (not where the
        separator strips the blanks beside it): tried once on `JOIN_PROBE`, the answer kept in
        the count cache."""
        if not self.separator:
            return False
        key = meta_key("joins")
        found = self.store.get(key)
        if found is None:
            batched = self.backend.count_each(JOIN_PROBE, self.separator)
            found = int(batched is not None and batched == [self.backend.count(text) for text in JOIN_PROBE])
            self.store.add({key: found})
        return bool(found)

    def knows(self, texts: Iterable[str]) -> bool:
        """Whether the count cache holds every one of `texts`."""
        return all(self.store.get(text_key(text)) is not None for text in texts)

    def gathering(self) -> tuple[TokenCounter, list[str]]:
        """A counter for a dry run of a turn (`ctx serve`'s first turn of a chat), and the texts
        it was asked that the cache lacks: each of those counts as the fallback's estimate (a
        quarter of its characters with none) and is gathered, for one `count_many` after — a
        request or a few for the turn's every new text, where the turn itself would ask the
        server once for each."""
        wanted: list[str] = []

        def count(text: str) -> int:
            found = self.store.get(text_key(text))
            if found is not None:
                return found
            wanted.append(text)
            return self._estimate(text) if self._local is not None else -(-len(text) // 4)

        dry = TokenCounter(
            f"{self.name}, dry run", count, specials=self.specials, bos=self.bos, added=self.added,
            parses_specials=True,
        )  # fmt: skip
        return dry, wanted


def server_counter(backend: Backend, cache_dir: Path, controls: tuple[str, ...] = ()) -> ServerCounter:
    """The counter of the server `backend` talks to. Its name says the server, its kind and
    the model it serves (`server http://127.0.0.1:8080 (llama.cpp, SmolLM2-135M-Instruct.Q4_1.gguf)`);
    `specials` are the control tokens the server names (llama.cpp's `/props` BOS and EOS; the
    others name none), then the `controls` the model's own file names; `bos` its BOS text;
    `added` what it adds to a whole prompt. Raises the backend's errors (down, no tokenize
    endpoint) before any counting."""
    server = backend.server()
    if not server.counts:
        backend.count(PROBE)  # raises NoTokenizer, naming the server
    store = CountStore(cache_dir, server.identity)
    named = (server.bos, server.eos) if server.kind == LLAMA_CPP else ()
    specials = tuple(dict.fromkeys(t for t in (*named, *controls) if t))
    where = backend.transport.url(backend.root)
    name = f"server {where} ({server.kind}, {server.model})" if server.model else f"server {where} ({server.kind})"
    separator = server.eos if server.kind == LLAMA_CPP else ""
    return ServerCounter(backend, store, name, specials, server.bos, separator)
