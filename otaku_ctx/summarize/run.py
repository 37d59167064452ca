"""`ctx summarize`'s core: plan what is missing or stale, ask the model for it, and commit
each finished scene to the sidecar (atomically) before the next request starts.

The plan: the sidecar's fresh scenes are kept; a stale one is redone over the same messages;
what no scene covers yet, up to the newest `settle` messages, is cut as otaku cuts it, then
cut smaller until each request fits the summarizer's window (counted with ctx's own counter,
with `SPARE` of the window left for the model's tokenizer counting differently). Summaries
first (`jobs` at once), then each history in story order, rolled from the history before it
and the scene's summary, so no prompt grows with the story."""

from __future__ import annotations

import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from ..backend import BadReply, ContextTooLong, FormatRefused, Reply
from ..backend.client import unicode_text
from ..errors import OtakuError
from ..story.model import Scene, Story
from ..story.sidecar import Record, covers, history_basis, judge, sha, sketch
from ..story.speakers import ROLE_WORDS, Speakers
from ..tokens import TokenCounter
from . import checks
from .extract import EXTRACT, history_extract, summary_extract
from .prompts import PLACEHOLDERS, Prompt
from .replies import Unreadable, bounded, field_in, json_object
from .spans import Cutting, Span, fitted, pack, why_cut

DEFAULT_WINDOW = 8192  # when neither --window, the config nor the server says
SPARE = 0.15  # of the window, kept free: the model's tokenizer may count more than ctx's
PER_MESSAGE = 8  # tokens a chat template adds around each message, about
TOKENS_PER_WORD = 2  # max_tokens asked per word wanted: room for any language, and the JSON
#: the share of the window a scene's summary and a history may take, and the fewest words either is given
SUMMARY_SHARE, HISTORY_SHARE, LEAST_WORDS = 1 / 16, 1 / 8, 40


def words_for(window: int, summary_words: int, history_words: int) -> tuple[int, int]:
    """A scene summary's and a history's words at `window` (`Options.for_window`)."""

    def share(of: float, configured: int) -> int:
        return min(configured, max(LEAST_WORDS, int(window * of / TOKENS_PER_WORD)))

    return share(SUMMARY_SHARE, summary_words), share(HISTORY_SHARE, history_words)


TEMPERATURE_STEP = 0.3  # each attempt after the first asks this much warmer
TOP_TEMPERATURE = 1.2
CHARS_PER_WORD = 12  # a summary or history is taken up to this many characters a word asked for
TITLE_CHARS = 120  # a title is taken up to this many characters


class SummarizeError(OtakuError):
    """A scene could not be summarized: one line saying which and what to do (exit 1)."""


@dataclass(frozen=True)
class Options:
    """What `[summarize]` and the flags decided, for one run."""

    cutting: Cutting = Cutting()
    summary_words: int = 400
    history_words: int = 200
    jobs: int = 1
    temperature: float = 0.2
    repeat_penalty: float = 0.0
    attempts: int = 3
    fallback: str = "extract"  # when no reply would do: "extract" (extract.py), or "none" (the scene is missing)

    def for_window(self, window: int) -> Options:
        """The lengths a `window` carries (docs/decisions.md, "Summary lengths follow the
        window"): a scene's summary at most `SUMMARY_SHARE` of it and a history `HISTORY_SHARE`,
        in words at `TOKENS_PER_WORD` (what a reply is given), never above the configured words
        nor below `LEAST_WORDS`: at 4,096, 128 and 200 words; at 2,048, 64 and 128."""
        summary, history = words_for(window, self.summary_words, self.history_words)
        return replace(self, summary_words=summary, history_words=history)

    @property
    def summary_tokens(self) -> int:
        return self.summary_words * TOKENS_PER_WORD + 64

    @property
    def history_tokens(self) -> int:
        return self.history_words * TOKENS_PER_WORD + 32


@dataclass(frozen=True)
class Planned:
    """One request the run will send: a scene's summary, or a history (`prompt_tokens` at most)."""

    kind: str  # "summary" | "history"
    span: Span
    prompt_tokens: int
    max_tokens: int
    cut: str = ""  # a summary's: why its scene ends where it does


@dataclass(frozen=True)
class Plan:
    story: Story
    kept: tuple[Record, ...]  # sidecar scenes whose summaries stand
    spans: tuple[Span, ...]  # scenes to summarize (new, or stale ones redone)
    histories_from: int | None  # the start of the first scene whose history is (re)rolled
    window: int
    window_source: str
    requests: tuple[Planned, ...]
    redone: int = 0  # of `spans`, how many redo a stale scene

    @property
    def usable(self) -> int:
        return usable_tokens(self.window)


def usable_tokens(window: int) -> int:
    return math.floor(window * (1 - SPARE))


def scene_text(story: Story, span: Span) -> str:
    """The scene as the prompt shows it: `[n] Name: text` (each speaker by name, `story.speakers`),
    a card as the character joining."""
    lines, speakers = [], Speakers.of(story)
    for m in story.messages[span[0] - 1 : span[1]]:
        if m.card is not None:
            lines.append(f"[{m.number}] ({m.card.name} joins the story.)")
            continue
        speaker, text = speakers.said(m)
        lines.append(f"[{m.number}] {speaker}: {text}")
    return "\n".join(lines)


def named(story: Story, span: Span) -> set[str]:
    """The scene's speakers by their names: those the story gives (its own, a name written in a
    message, the frame's), not the last resort's role words."""
    speakers = Speakers.of(story)
    return {
        speaker
        for m in story.messages[span[0] - 1 : span[1]]
        if m.card is None and (speaker := speakers.said(m)[0]) not in ROLE_WORDS.values()
    }


class Prompts:
    """The two prompts and how to count what they send."""

    def __init__(self, summary: Prompt, history: Prompt, options: Options, count: TokenCounter) -> None:
        self.summary, self.history, self.options, self.count = summary, history, options, count

    def at(self, window: int) -> Prompts:
        """These prompts asking for the lengths `window` carries (`Options.for_window`)."""
        options = self.options.for_window(window)
        return self if options == self.options else Prompts(self.summary, self.history, options, self.count)

    def tokens(self, messages: list[dict[str, str]]) -> int:
        return sum(self.count(m["content"]) + PER_MESSAGE for m in messages)

    def instructions(self, prompt: Prompt) -> str:
        """The prompt's own words, its placeholders left out: what a reply must not repeat."""
        names = (*PLACEHOLDERS[prompt.kind][0], *PLACEHOLDERS[prompt.kind][1])
        user = prompt.user
        for name in names:
            user = user.replace("{" + name + "}", " ")
        return f"{prompt.system}\n{user}"

    def summary_check(self, story: Story, span: Span) -> checks.Scene:
        speakers = named(story, span)
        speakers |= {m.card.name for m in story.messages[span[0] - 1 : span[1]] if m.card is not None}
        instructions, words = self.instructions(self.summary), self.options.summary_words
        return checks.Scene.of(scene_text(story, span), speakers, instructions, words)

    def history_check(self, story: Story, span: Span, summary: str, title: str) -> checks.Scene:
        speakers = named(story, span)
        instructions, words = self.instructions(self.history), self.options.history_words
        return checks.Scene.of(f"{title}\n{summary}", speakers, instructions, words)

    def summary_messages(self, story: Story, span: Span) -> list[dict[str, str]]:
        values = {"scene": scene_text(story, span), "summary_words": str(self.options.summary_words)}
        return self.summary.messages(values)

    def history_messages(self, history: str, summary: str, title: str) -> list[dict[str, str]]:
        values = {
            "history": history or "(nothing yet)",
            "summary": summary,
            "title": title,
            "history_words": str(self.options.history_words),
        }
        return self.history.messages(values)


def plan(
    story: Story,
    records: list[Record],
    prompts: Prompts,
    window: int,
    window_source: str,
    redo: frozenset[int] = frozenset(),
) -> Plan:
    """What this run will do, and every request it will send, without sending one. The scenes
    starting at `redo` are done again as if stale (`ctx scenes --redo`). The summaries and
    histories are asked at the lengths the window carries (`Prompts.at`)."""
    prompts = prompts.at(window)
    options, cutting = prompts.options, prompts.options.cutting
    usable = usable_tokens(window)
    judged = judge(story, records)
    fresh = {r.start: r for r in judged.fresh if r.start not in redo}
    stale = {r.start: r for r in (*judged.stale, *judged.touched)}  # a touched scene is redone too
    stale.update({r.start: r for r in judged.fresh if r.start in redo})
    n = len(story.messages)
    limit = n - cutting.settle
    cursor = story.scenes[-1].end if story.scenes else 0
    kept: list[Record] = []
    wanted: list[Span] = []
    stale_spans: set[Span] = set()
    redone = 0

    def cut(first: int, last: int, *, alone: bool) -> None:
        if first <= last:
            wanted.extend(pack(story.messages[first - 1 : last], cutting, leftover_alone=alone))

    for start in sorted({*fresh, *stale}):
        record = fresh.get(start) or stale[start]
        if record.start <= cursor or (start in stale and (record.end > limit or record.end > n)):
            continue
        cut(cursor + 1, record.start - 1, alone=True)
        if start in fresh:
            kept.append(record)
        else:
            wanted.append((record.start, record.end))
            stale_spans.add((record.start, record.end))
            redone += 1
        cursor = record.end
    cut(cursor + 1, limit, alone=False)

    def fits(span: Span) -> bool:
        return prompts.tokens(prompts.summary_messages(story, span)) + options.summary_tokens <= usable

    spans: list[Span] = []
    cuts: dict[Span, str] = {}
    for span in wanted:
        if span in stale_spans:
            why = "a scene redone over its messages"
        elif span[1] == limit:
            why = f"the newest {cutting.settle} messages settle first"
        else:
            why = why_cut(story.messages, span[1], cutting)
        for piece in fitted(span, fits):
            cuts[piece] = why if piece[1] == span[1] else "cut smaller to fit the window"
            if not fits(piece):
                need = prompts.tokens(prompts.summary_messages(story, piece)) + options.summary_tokens
                raise SummarizeError(
                    f"message {piece[0]:,} alone needs {need:,} tokens to summarize, more than the "
                    f"{usable:,} of the summarizer's {window:,}-token window ctx uses ({window_source}); "
                    "use a model with a larger context (--window), or lower summary_words"
                )
            spans.append(piece)
    # histories: from the first scene that is new, redone, or whose history is stale
    after = [*kept, *(Record(0, a, b, "", "") for a, b in spans)]
    after.sort(key=lambda r: r.start)
    new_starts = {a for a, _ in spans}
    histories_from = next((r.start for r in after if r.start in new_starts or r.start not in judged.history_ok), None)
    requests = [
        Planned("summary", s, prompts.tokens(prompts.summary_messages(story, s)), options.summary_tokens, cuts[s])
        for s in spans
    ]
    empty = prompts.tokens(prompts.history_messages("", "", ""))
    previous: Scene | Record | None = story.scenes[-1] if story.scenes else None
    for r in after:
        if histories_from is None or r.start < histories_from:
            previous = r
            continue
        if previous is None:  # the first history of a story is its first summary, asked of nobody
            previous = r
            continue
        # the story so far it is rolled from: known for the first (the story's own, a memory, a
        # history edited by hand: any length), one this run asks for after that (at most
        # history_tokens); the scene's summary and title: a kept one's as they are
        earlier = prompts.count(rolled_from(story, previous)) if r.start == histories_from else options.history_tokens
        scene = options.summary_tokens if r.start in new_starts else prompts.count(r.summary) + prompts.count(r.title)
        need = empty + earlier + scene
        if need + options.history_tokens > usable:
            raise SummarizeError(
                f"the history through messages {r.start:,}–{r.end:,} needs up to {need + options.history_tokens:,} "
                f"tokens ({earlier:,} of them the story so far it is rolled from), more than the {usable:,} of the "
                f"summarizer's {window:,}-token window ctx uses ({window_source}); use a model with a larger "
                "context (--window), or lower summary_words and history_words"
            )
        requests.append(Planned("history", (r.start, r.end), need, options.history_tokens))
        previous = r
    return Plan(story, tuple(kept), tuple(spans), histories_from, window, window_source, tuple(requests), redone)


def rolled_from(story: Story, previous: Scene | Record) -> str:
    """The story so far a history after `previous` is rolled from: its history; when it has
    none (a story's own scenes may carry only summaries), the story's own summaries."""
    return previous.history or "\n\n".join(s.summary for s in story.scenes if s.summary)


@dataclass
class Progress:
    """Where a run is, for the progress bar."""

    done: int = 0
    total: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    requests: int = 0
    started: float = field(default_factory=time.monotonic)
    phase: str = ""
    # prompt tokens, of the requests done and of all (the rest as expected): the ETA weighs each
    # request by them, since a scene's request takes many times a history's (`Expected`)
    work: int = 0
    worked: int = 0
    rejected: list[str] = field(default_factory=list)  # each reply a check turned down, for --debug
    extracts: int = 0  # summaries and histories written as extracts (`extract.py`)
    turned_down: int = 0  # the model's replies a check turned down
    why_turned_down: str = ""  # the last one's reason

    @property
    def eta(self) -> float | None:
        if not self.done or self.done >= self.total:
            return None
        elapsed = time.monotonic() - self.started
        if self.work > 0 and 0 < self.worked < self.work:
            return elapsed / self.worked * (self.work - self.worked)
        return elapsed / self.done * (self.total - self.done)


@dataclass(frozen=True)
class Report:
    summaries: int
    histories: int
    kept: int
    redone: int
    requests: int
    tokens_in: int
    tokens_out: int
    seconds: float
    scenes: int  # in the sidecar now
    covered_to: int  # the last message a scene covers (0: none)
    missing: tuple[tuple[int, int, str], ...] = ()  # (start, end, why) of each scene no reply would do
    extracts: int = 0  # summaries and histories written as extracts of the scene's own lines
    turned_down: int = 0  # the model's replies a check turned down

    def facts(self) -> dict[str, Any]:
        facts = dict(self.__dict__)
        facts["missing"] = [{"start": a, "end": b, "why": why} for a, b, why in self.missing]
        return facts


class SummaryBackend(Protocol):
    """What a summary run uses of a `Backend`: serve's gated one (`serve.gate.GatedBackend`)
    is another, so the type checker holds the two to the same fields."""

    url: str
    model: str

    def window(self) -> int | None: ...

    def chat(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        max_tokens: int,
        temperature: float,
        response_format: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Reply: ...

    def loop_penalty(self) -> dict[str, float]: ...


class Asker:
    """Asks the model for one field of a JSON reply: `response_format` json_schema first, then
    json_object when the server refuses it, then plain instructions; a reply with no usable text
    is asked again, up to `attempts` times, then reported."""

    MODES = ("json_schema", "json_object", "plain")

    def __init__(self, backend: SummaryBackend, options: Options, progress: Progress) -> None:
        self.backend, self.options, self.progress = backend, options, progress
        self.mode = 0
        self.lock = threading.Lock()

    def _format(self, name: str, words: int, mode_index: int) -> Mapping[str, Any] | None:
        schema = {
            "type": "object",
            "properties": {name: {"type": "string", "minLength": 1, "maxLength": words * CHARS_PER_WORD}},
            "required": [name],
        }
        if name == "summary":
            title = {"type": "string", "maxLength": TITLE_CHARS}
            schema["properties"] = {"title": title, **schema["properties"]}  # type: ignore[dict-item]
            schema["required"] = ["title", "summary"]
        mode = self.MODES[mode_index]
        if mode == "json_schema":
            return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
        if mode == "json_object":
            return {"type": "json_object", "schema": schema}
        return None

    def ask(
        self,
        messages: list[dict[str, str]],
        name: str,
        words: int,
        max_tokens: int,
        what: str,
        scene: checks.Scene,
        also: str = "",
    ) -> tuple[str, str]:
        """(the text of field `name` that passes the checks, the reply's title when one passes).
        Each attempt asks differently: the temperature a step higher, and the reply's form one
        step looser (JSON schema, then any JSON object, then prose that ctx reads); after a
        reply that looped, with the server's penalty on repeating too (`Backend.loop_penalty`:
        a small model's loops are its commonest junk, and a warmer temperature alone does not
        end them)."""
        extra = {"repeat_penalty": self.options.repeat_penalty} if self.options.repeat_penalty > 0 else {}
        penalized = False
        last = ""
        tries = 0
        while tries < self.options.attempts:
            with self.lock:
                mode = max(self.mode, min(tries, len(self.MODES) - 1))
            temperature = min(TOP_TEMPERATURE, self.options.temperature + TEMPERATURE_STEP * tries)
            try:
                reply = self.backend.chat(
                    messages,
                    max_tokens=max_tokens,
                    temperature=temperature,
                    response_format=self._format(name, words, mode),
                    extra=extra or None,
                )
            except FormatRefused:
                with self.lock:
                    if self.mode < len(self.MODES) - 1 and self.MODES[self.mode] != "plain":
                        self.mode += 1
                    refused_all = mode >= len(self.MODES) - 1
                if refused_all:
                    raise
                continue
            tries += 1
            with self.lock:
                self.progress.requests += 1
                self.progress.tokens_in += reply.prompt_tokens or 0
                self.progress.tokens_out += reply.completion_tokens or 0
            text, title = self._taken(reply, name, words)
            why = "no usable text" if not text else checks.rejected(name, text, scene, also)
            if text and why is None:
                if title and checks.rejected("title", title, scene) is not None:
                    self.progress.rejected.append(f"{what}: title {title!r} rejected; the default one stands")
                    title = ""
                return text, title
            last = " ".join(reply.text[:400].split())[:80]
            then = ""
            if not penalized and tries < self.options.attempts and checks.looping(text or reply.text) is not None:
                penalty = self.backend.loop_penalty()  # the user's own stronger one stands
                extra, penalized = {**extra, **{k: max(v, extra.get(k, v)) for k, v in penalty.items()}}, True
                then = " (the next with " + ", ".join(f"{k} {v:g}" for k, v in penalty.items()) + ")"
            with self.lock:
                self.progress.rejected.append(f"{what}: attempt {tries}: {why}: {last!r}{then}")
                self.progress.turned_down += 1
                self.progress.why_turned_down = why or "no usable text"
        raise SummarizeError(
            f"{self.backend.url}: {what}: {tries} replies held no usable {name} (the last: {last!r}); "
            "run again, or try another model"
        )

    @staticmethod
    def _taken(reply: Reply, name: str, words: int) -> tuple[str | None, str]:
        """(the reply's field `name`, its title), each bounded: a reply may run far past
        `max_tokens` (a server that ignores it), and no more than the JSON schema's `maxLength`
        of it is taken (`replies.bounded`). A lone surrogate the JSON in it spells (`\\ud800`) is
        U+FFFD, as in the reply itself; JSON nested past reading, or of more items than what was
        asked could hold, is the server's bad reply. The JSON is read once, for both."""
        try:
            found = json_object(reply.text)
        except Unreadable as why:
            raise BadReply(reply.url or "the server", str(why)) from None
        text = field_in(reply.text, found, name)
        title = (found or {}).get("title") if name == "summary" else None
        text = bounded(unicode_text(text), words * CHARS_PER_WORD) if text else text
        return text, bounded(unicode_text(title.strip()), TITLE_CHARS) if isinstance(title, str) else ""


class Expected:
    """The prompt tokens of the requests still to come, as the run has measured them so far: a
    scene's request is known exactly from the plan; a history's holds the story so far and a
    summary that do not exist yet, so it is expected at the size of the ones written so far (at
    the plan's bound until there are some). `progress.work` is kept at what is done plus that."""

    def __init__(self, plan: Plan, prompts: Prompts, progress: Progress) -> None:
        self.prompts, self.progress = prompts, progress
        self.scenes = {r.span: r.prompt_tokens for r in plan.requests if r.kind == "summary"}
        self.histories_left = sum(r.kind == "history" for r in plan.requests)
        self.bound = max((r.prompt_tokens for r in plan.requests if r.kind == "history"), default=0)
        self.empty = prompts.tokens(prompts.history_messages("", "", ""))
        self.summaries: list[int] = []
        self.written: list[int] = []  # the histories' own lengths
        self.update()

    def summary_done(self, span: Span, record: Record | None) -> None:
        self.progress.worked += self.scenes.pop(span, 0)
        if record is not None:
            self.summaries.append(self.prompts.count(record.summary) + self.prompts.count(record.title))
        self.update()

    def history_done(self, prompt_tokens: int, history: str) -> None:
        self.progress.worked += prompt_tokens
        self.histories_left = max(0, self.histories_left - 1)
        self.written.append(self.prompts.count(history))
        self.update()

    def history(self) -> int:
        if not self.summaries:
            return self.bound
        summary = sum(self.summaries) / len(self.summaries)
        earlier = sum(self.written) / len(self.written) if self.written else summary
        return min(self.bound, round(self.empty + earlier + summary))

    def update(self) -> None:
        left = sum(self.scenes.values()) + self.histories_left * self.history()
        self.progress.work = self.progress.worked + left


Save = Callable[[list[Record]], None]


def run(
    plan: Plan,
    backend: SummaryBackend,
    prompts: Prompts,
    save: Save,
    progress: Progress | None = None,
    on_progress: Callable[[Progress], None] = lambda p: None,
) -> Report:
    """Do the plan: each finished scene is handed to `save` (every scene of the run as it
    stands, for `commits.Commits` to merge into the sidecar) before the next request starts."""
    prompts = prompts.at(plan.window)
    story, options = plan.story, prompts.options
    progress = progress or Progress()
    progress.total = len(plan.requests)
    expected = Expected(plan, prompts, progress)
    asker = Asker(backend, options, progress)
    records: dict[int, Record] = {r.start: r for r in plan.kept}
    model = backend.model

    def commit() -> None:
        save(sorted(records.values(), key=lambda r: r.start))

    def summarize(span: Span) -> Record:
        what = f"scene of messages {span[0]:,}–{span[1]:,}"
        messages, check = prompts.summary_messages(story, span), prompts.summary_check(story, span)
        made_by = model
        try:
            summary, title = asker.ask(messages, "summary", options.summary_words, options.summary_tokens, what, check)
        except SummarizeError as error:
            if options.fallback != "extract":
                raise
            summary, title, made_by = (
                summary_extract(story.messages[span[0] - 1 : span[1]], options.summary_words, Speakers.of(story)),
                "",
                EXTRACT,
            )
            progress.rejected.append(f"{what}: written as an extract of its own lines ({error})")
            progress.extracts += 1
        return Record(
            id=0,
            start=span[0],
            end=span[1],
            title=title or f"Messages {span[0]:,}–{span[1]:,}",
            summary=summary,
            covers=covers(story, *span),
            sketch=sketch(story, *span),
            model=made_by,
            made=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            summary_sha=sha(summary),
        )

    started = time.monotonic()
    missing: list[tuple[int, int, str]] = []
    summaries = _summaries(plan, summarize, records, commit, options.jobs, progress, on_progress, missing, expected)
    histories = _histories(plan, records, asker, prompts, commit, progress, on_progress, missing, expected)
    ordered = sorted(records.values(), key=lambda r: r.start)
    return Report(
        summaries=summaries,
        histories=histories,
        kept=len(plan.kept),
        redone=plan.redone,
        requests=progress.requests,
        tokens_in=progress.tokens_in,
        tokens_out=progress.tokens_out,
        seconds=round(time.monotonic() - started, 3),
        scenes=len(ordered),
        covered_to=ordered[-1].end if ordered else (story.scenes[-1].end if story.scenes else 0),
        missing=tuple(sorted(missing)),
        extracts=progress.extracts,
        turned_down=progress.turned_down,
    )


def _numbered(story: Story, records: dict[int, Record]) -> None:
    """Give the sidecar's scenes their ids: their place among all the story's scenes."""
    base = len(story.scenes)
    for number, start in enumerate(sorted(records), base + 1):
        if records[start].id != number:  # the others stand as they are: a commit compares them
            records[start] = replace(records[start], id=number)


def _summaries(
    plan: Plan,
    summarize: Callable[[Span], Record],
    records: dict[int, Record],
    commit: Callable[[], None],
    jobs: int,
    progress: Progress,
    on_progress: Callable[[Progress], None],
    missing: list[tuple[int, int, str]],
    expected: Expected,
) -> int:
    """The scenes' summaries, `jobs` requests at once; each one committed as it finishes, and
    only then is the next request handed out. A span the server finds too long is cut in two; a
    scene no reply would do for is put in `missing`, and the run goes on with the others."""
    pending: deque[Span] = deque(plan.spans)
    jobs_q: queue.Queue[Span | None] = queue.Queue()
    results: queue.Queue[tuple[Span, Record | BaseException]] = queue.Queue()

    def worker() -> None:
        while (span := jobs_q.get()) is not None:
            try:
                results.put((span, summarize(span)))
            except BaseException as error:  # noqa: BLE001 - handed to the main thread
                results.put((span, error))

    workers = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, min(jobs, len(pending))))]
    for each in workers:
        each.start()
    done = in_flight = 0
    try:
        while pending or in_flight:
            while pending and in_flight < len(workers):
                jobs_q.put(pending.popleft())
                in_flight += 1
            progress.phase = f"summarizing scenes ({in_flight} asked)"
            on_progress(progress)
            span, outcome = results.get()
            in_flight -= 1
            if isinstance(outcome, ContextTooLong) and span[0] < span[1]:
                middle = (span[0] + span[1]) // 2
                pending.extendleft([(middle + 1, span[1]), (span[0], middle)])
                progress.total += 2 if plan.histories_from is not None else 1  # a summary more, and its history
                continue
            expected.summary_done(span, None if isinstance(outcome, BaseException) else outcome)
            if isinstance(outcome, SummarizeError):
                missing.append((span[0], span[1], str(outcome)))
                progress.done += 1
                on_progress(progress)
                continue
            if isinstance(outcome, BaseException):
                raise outcome
            records[outcome.start] = outcome
            _numbered(plan.story, records)
            commit()
            done += 1
            progress.done += 1
            on_progress(progress)
    finally:
        for _ in workers:
            jobs_q.put(None)
    return done


def _histories(
    plan: Plan,
    records: dict[int, Record],
    asker: Asker,
    prompts: Prompts,
    commit: Callable[[], None],
    progress: Progress,
    on_progress: Callable[[Progress], None],
    missing: list[tuple[int, int, str]],
    expected: Expected,
) -> int:
    """Each history from the first stale one on, in story order: the previous history and this
    scene's summary rolled into the new story so far (the first of a story is its summary). The
    chain stops at the first scene without a summary, or whose history no reply would do for:
    a history after it would leave that scene out."""
    if plan.histories_from is None:
        return 0
    story, options = plan.story, prompts.options
    gap = min((a for a, _, _ in missing), default=None)
    previous: Scene | Record | None = story.scenes[-1] if story.scenes else None
    rolled = 0
    for start in sorted(records):
        record = records[start]
        if start < plan.histories_from:
            previous = record
            continue
        if gap is not None and start > gap:
            break
        written_by = record.model if previous is None else asker.backend.model
        if previous is None:  # the story's first: its summary, an extract if that is one
            history = record.summary
            progress.extracts += record.model == EXTRACT
        else:
            earlier = rolled_from(story, previous)
            messages = prompts.history_messages(earlier, record.summary, record.title)
            what = f"the history through messages {record.start:,}–{record.end:,}"
            progress.phase = f"rolling {what}"
            on_progress(progress)
            check = prompts.history_check(story, (record.start, record.end), record.summary, record.title)
            words, tokens = options.history_words, options.history_tokens
            try:
                history, _ = asker.ask(messages, "history", words, tokens, what, check, also=earlier)
            except SummarizeError as error:
                if options.fallback != "extract":
                    missing.append((record.start, record.end, str(error)))
                    break
                history, written_by = history_extract(earlier, record.summary, words), EXTRACT
                progress.rejected.append(f"{what}: written as an extract ({error})")
                progress.extracts += 1
            finally:
                progress.done += 1
            expected.history_done(prompts.tokens(messages), history)
        record = replace(
            record,
            history=history,
            history_model="" if written_by == record.model else written_by,
            history_from=history_basis(previous),
            summary_sha=sha(record.summary),
        )
        records[start] = record
        commit()
        rolled += 1
        previous = record
        on_progress(progress)
    return rolled
