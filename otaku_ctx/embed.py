"""Recall by meaning, the I/O half (the other is `assemble/meaning.py`, pure): the embedding
model `[recall]` names, asked through `backend/` for the vectors of a story's texts (written
beside its summaries, `story/vectors.py`) and, each turn, of its two queries; a story's
`meaning` made of them. Every failure is a reason, never an error: the keyword engine recalls
alone and says why (seed 000: "one or the other is always active, never neither")."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from .backend import Backend, BackendError, Cancel
from .config import RecallSettings
from .errors import OtakuError
from .story.meaning import Meaning, Vector, key_of, quantized
from .story.model import Story
from .story.speakers import Speakers
from .story.vectors import Vectors, VectorsError, append_vectors, vectors_for

#: the characters of a text that are embedded (a small embedding model reads 512 tokens; the
#: key is of the whole text, so an edit past them still embeds it again)
MOST_CHARS = 1500
#: the newest messages whose text is the recent window's query (`recall.NEWEST`'s count)
RECENT = 10
#: seconds a request of the background writer may take (a batch of texts)
WRITE_TIMEOUT = 120.0


def embedder(settings: RecallSettings, timeout: float | None = None) -> Backend:
    """The embedding model's server, each request bounded by `timeout` (the turn's, by default)."""
    return Backend(
        settings.url,
        settings.model,
        api_key_env=settings.api_key_env or None,
        timeout=settings.timeout if timeout is None else timeout,
        connect_timeout=min(settings.timeout if timeout is None else timeout, 10.0),
    )


def embedded(text: str) -> str:
    """What of a text is sent to be embedded: its first `MOST_CHARS` characters."""
    return text[:MOST_CHARS]


def texts_of(story: Story) -> list[str]:
    """What a story's recall may look for by meaning: each message's text (its cards left out)
    and each scene's summary, once each, in story order."""
    texts = [m.content for m in story.messages if m.card is None and m.content.strip()]
    texts += [s.summary for s in story.scenes if s.summary.strip()]
    return list(dict.fromkeys(texts))


def queries_of(story: Story) -> tuple[str, str]:
    """The two queries of the story's newest turn: the newest user message, and the recent
    window (the newest `RECENT` messages, one a line, who spoke first, named as ctx names a
    story's speakers wherever it writes its lines: `story.speakers`)."""
    question = next((m.content for m in reversed(story.messages) if m.role == "user" and m.card is None), "")
    speakers = Speakers.of(story)
    lines = (speakers.said(m) for m in story.messages[-RECENT:] if m.card is None and m.content.strip())
    recent = "\n".join(f"{who}: {text}" for who, text in lines)
    return question.strip(), recent[-MOST_CHARS:]


def vectors_path(story: Story | Path, settings: RecallSettings, sidecar: Path | None = None) -> Path | None:
    """Where the story's vectors of `settings`' model are: beside its summaries (`sidecar`, or
    where `ctx summarize` would write them); None for a story read from stdin."""
    from .story.sidecar import sidecar_for

    path = story.path if isinstance(story, Story) else story
    if sidecar is None and (str(path) in ("-", "<stdin>") or not str(path)):
        return None
    return vectors_for(sidecar or sidecar_for(path), settings.model)


@dataclass
class Held:
    """A vectors file held open for a run of turns, read again when it has grown."""

    path: Path | None
    model: str
    vectors: Vectors | None = None
    size: int = -1

    def current(self) -> Vectors | None:
        if self.path is None:
            return None
        try:
            size = self.path.stat().st_size
        except OSError:
            size = 0
        if size != self.size:
            if self.vectors is not None:
                self.vectors.close()
            self.vectors, self.size = Vectors(self.path, self.model), size
        return self.vectors


def meaning_for(story: Story, settings: RecallSettings, held: Held, backend: Backend | None = None) -> Meaning:
    """The story's meaning at its newest turn: its texts' vectors as the file holds them, and
    the two queries embedded now (one request, `[recall] timeout` at most). A failure is the
    meaning's `failed`: the keyword engine then recalls alone, and says why."""
    model = settings.model
    try:
        vectors = held.current()
    except VectorsError as error:
        return Meaning(model, failed=f"its vectors file cannot be read: {error.message}")
    if vectors is None or not len(vectors):
        return Meaning(model, failed="no vectors written yet (`ctx embed` writes them)")
    question, recent = queries_of(story)
    asked = [text for text in (question, recent) if text]
    if not asked:
        return Meaning(model, failed="no question to embed")
    try:
        found = (backend or embedder(settings)).embed([embedded(t) for t in asked])
    except (BackendError, OtakuError) as error:
        return Meaning(model, failed=f"the embeddings server: {error}")
    if vectors.dimensions is not None and len(found[0]) != vectors.dimensions:
        return Meaning(model, failed=f"the model gives {len(found[0])} numbers, its vectors {vectors.dimensions}")
    queried = dict(zip(asked, map(quantized, found), strict=True))

    def vector_of(text: str) -> Vector | None:
        return vectors.get(key_of(text))

    return Meaning(model, vector_of, queried.get(question), queried.get(recent))


def with_meaning(story: Story, settings: RecallSettings, held: Held) -> Story:
    """`story` with its meaning, when `[recall]` names an embedding model."""
    return replace(story, meaning=meaning_for(story, settings, held)) if settings.on else story


@dataclass
class Written:
    """What a writing run did: texts embedded, requests made, texts that had their vector."""

    embedded: int = 0
    requests: int = 0
    had: int = 0
    seconds: float = 0.0


def missing(texts: Sequence[str], path: Path, model: str) -> list[str]:
    """The texts whose vector the file does not hold."""
    with Vectors(path, model) as vectors:
        return [t for t in texts if key_of(t) not in vectors]


def write_vectors(
    texts: Sequence[str],
    path: Path,
    backend: Backend,
    batch: int,
    *,
    asking: Callable[[], AbstractContextManager[Cancel]] | None = None,
    progress: Callable[[Written], None] = lambda w: None,
) -> Written:
    """Embed the texts the file lacks, `batch` a request, each batch appended as it comes (an
    interruption loses at most the batch being asked). `asking`: where each request waits its
    turn (serve's gate: in the player's pauses, stopped by a live turn, asked again)."""
    started = time.monotonic()
    wanted = missing(texts, path, backend.model)
    written = Written(had=len(texts) - len(wanted))
    for at in range(0, len(wanted), batch):
        chunk = wanted[at : at + batch]
        with (asking or _unlimited)() as cancel:
            vectors = backend.embed([embedded(t) for t in chunk], cancel=cancel)
        written.requests += 1
        pairs = zip(map(key_of, chunk), map(quantized, vectors), strict=True)
        written.embedded += append_vectors(path, backend.model, pairs)
        progress(written)
    written.seconds = round(time.monotonic() - started, 3)
    return written


def embed_story(
    story: Story, settings: RecallSettings, sidecar: Path | None, progress: Callable[[Written], None]
) -> tuple[Path, int, Written]:
    """`ctx embed`: the vectors the story's texts lack, written beside its summaries (`sidecar`,
    else where `ctx summarize` writes them): (the vectors file, the texts, what was done)."""
    path = vectors_path(story, settings, sidecar)
    assert path is not None, "a story read from stdin has no file to keep vectors beside"
    texts = texts_of(story)
    done = write_vectors(texts, path, embedder(settings, WRITE_TIMEOUT), settings.batch, progress=progress)
    return path, len(texts), done


@contextmanager
def _unlimited() -> Iterator[Cancel]:
    yield Cancel()
