"""Config in one place: find the file, load it, validate it, layer the command line on top.

`~/.otaku/configs/config.toml` (`OTAKU_HOME` replaces `~/.otaku`; `--config PATH` names
another file). A missing file means the built-in defaults. Each section is a frozen
dataclass whose fields are the TOML keys: their defaults, types and help are the schema
that validation, `ctx config init` and `ctx config show` are all derived from. Each
effective value remembers where it came from, so `ctx config show` can say.
"""

from __future__ import annotations

import json
import math
import re
import stat
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, cast

from .assemble import CACHES, Policy, Recall, Shape
from .errors import ConfigError, UsageError
from .locations import config_path
from .lore.rules import ENGINE_DEFAULTS, ENGINES, STRATEGIES, Engine, LoreRules, Strategy
from .tokens import TOKENIZERS

DEFAULT_CARD_TEMPLATE = (
    "{{name}} joins the story.\n"
    "{{#if description}}{{description}}\n{{/if}}"
    "{{#if personality}}{{name}}'s personality: {{personality}}\n{{/if}}"
    "{{#if scenario}}Scenario: {{scenario}}\n{{/if}}"
    "{{#if exampleDialogue}}Example dialogue:\n{{exampleDialogue}}\n{{/if}}"
)
# No window, tail or head is anywhere near this; a bigger number is a typo, and bounding it
# keeps every loop over rungs and messages bounded.
MOST = 1_000_000_000
Kind = Literal[
    "count",
    "factor",
    "share",
    "reserve",
    "tokenizer",
    "cache",
    "text",
    "engine",
    "strategy",
    "files",
    "depth",
    "switch",
    "flag",
    "seconds",
    "patterns",
    "fallback",
    "hours",
    "speakers",
    "placement",
]

#: how chat messages name who speaks (`[prompt] speakers`)
SPEAKERS = ("labelled", "as_given")


def setting(default: Any, help: str, kind: Kind, *, least: int = 0) -> Any:
    """A settings field: its default, what it accepts (`kind`, at least `least`) and what it means."""
    return field(default=default, metadata={"help": help, "kind": kind, "least": least})


@dataclass(frozen=True)
class ContextSettings:
    """`[context]`: the numbers of the seed that shape the prompt, and the reply reserve."""

    head_messages: int = setting(20, "opening messages kept verbatim", "count")
    min_tail_messages: int = setting(150, "at least this many recent messages kept verbatim", "count")
    max_context: int = setting(0, "the prompt may use at most this many tokens; 0 = the model's window", "count")
    tail_step: int = setting(50, "case 5: the tail target drops by this many messages per rung", "count", least=1)
    tail_floor: int = setting(50, "case 5: the tail target never drops below this", "count")
    reply_reserve: int | Literal["auto"] = setting("auto", 'tokens kept free for the reply, or "auto"', "reserve")
    reserve_replies: int = setting(5, "auto reserve: look at this many of the last assistant replies", "count")
    reserve_factor: float = setting(1.2, "auto reserve: the longest of them times this", "factor")
    reserve_default: int = setting(1024, "auto reserve before any assistant reply exists", "count")
    cache: str = setting(
        "exact",
        'how a shape is chosen: "exact" (the first that fits) or "stable" (keeps the prompt\'s prefix)',
        "cache",
    )
    cache_slack: float = setting(0.03, "stable: share of the limit left free when the shape changes (0 to 1)", "share")
    recall: float = setting(
        0.0, "share of the limit for the older messages and summaries the newest recall (0 = off, to 0.5)", "share"
    )

    def shape(self) -> Shape:
        """The seed's numbers, as the assembler takes them."""
        return Shape(self.head_messages, self.min_tail_messages, self.tail_step, self.tail_floor)

    def policy(self) -> Policy:
        """How the assembler chooses among the candidates that fit."""
        return Policy("stable" if self.cache == "stable" else "exact", self.cache_slack)

    def recalling(self) -> Recall:
        """What the assembler may recall of what a prompt leaves out (seed 000's other pools)."""
        return Recall(min(0.5, self.recall))


@dataclass(frozen=True)
class PromptSettings:
    """`[prompt]`: how the prompt is rendered."""

    template: str = setting("default", "context template: default, serene, sillytavern, or a .hbs path", "text")
    format: str = setting(
        "chat", "prompt format: chat, chatml, llama3, mistral, alpaca, vicuna, gemma, raw, or a path", "text"
    )
    post_history_depth: int = setting(
        0, "post-history reminder: 0 = just before the reply, N = N messages earlier", "count"
    )
    instructions: str = setting("", "instructions for {{instructions}} when the story has none", "text")
    post_history_instructions: str = setting("", "the reminder's instructions (postHistory.instructions)", "text")
    card_template: str = setting(DEFAULT_CARD_TEMPLATE, "how a card message reads (Handlebars)", "text")
    user: str = setting("", "the user's persona name ({{user}}); empty: the story's, else its user rows'", "text")
    char: str = setting(
        "", "the character's name ({{char}}); empty: the story's, its card's, or its main speaker", "text"
    )
    speakers: str = setting(
        "labelled",
        'chat messages: "labelled" ("Name: text", turns of one role merged) or "as_given" (only a name the'
        " message carries, turns as they came; ctx serve's default)",
        "speakers",
    )


@dataclass(frozen=True)
class ModelSettings:
    """`[model]`: the model the prompt is for."""

    use: str = setting(
        "", "the model you run: a GGUF file, a Hugging Face folder or an Ollama name (docs/model.md)", "text"
    )
    window: int = setting(8192, "the model's context window in tokens (with `use`: the model's own)", "count", least=1)
    tokenizer: str = setting(
        "cl100k_base",
        'token counter: "cl100k_base", "estimate" (len/4), "server", or a tokenizer file (docs/model.md)',
        "tokenizer",
    )
    server: str = setting(
        "", "the model server you run, e.g. http://127.0.0.1:8080; it counts when no tokenizer is set", "text"
    )
    name: str = setting("", 'the "model" of openai-chat/openai-completion request bodies; "" = left out', "text")
    max_stop_strings: int = setting(
        4, "request bodies send at most this many stop strings (OpenAI: 4); 0 = all", "count"
    )


@dataclass(frozen=True)
class LoreSettings:
    """`[lore]`: World Info (docs/lore.md). The names are SillyTavern's `world_info_*` settings
    without the prefix; "auto" takes the engine's default."""

    engine: str = setting("keyword", 'which entries win: "keyword" (seed 000, by relevance) or "sillytavern"', "engine")
    files: tuple[str, ...] = setting((), "World Info JSON files read for every story (relative to this file)", "files")
    scan_depth: int | Literal["auto"] = setting(
        "auto", 'messages scanned for keys, newest first; "auto": keyword 10, sillytavern 2', "depth"
    )
    budget: float = setting(25.0, "lore may take this percent of the limit", "factor")
    budget_cap: int = setting(0, "and at most this many tokens; 0 = no cap", "count")
    recursive: bool | Literal["auto"] = setting(
        "auto", 'scan fired entries for more keys; "auto": keyword false, sillytavern true', "switch"
    )
    max_recursion_steps: int = setting(0, "scan passes at most; 0 = no limit", "count")
    case_sensitive: bool = setting(False, "keys match case (an entry's caseSensitive wins)", "flag")
    match_whole_words: bool | Literal["auto"] = setting(
        "auto", 'keys match whole words; "auto": keyword false, sillytavern true', "switch"
    )
    include_names: bool = setting(True, 'scan messages as "Name: text"', "flag")
    min_activations: int = setting(0, "scan deeper until this many entries fire; 0 = off", "count")
    min_activations_depth_max: int = setting(0, "but no deeper than this; 0 = the whole chat", "count")
    group_scoring: bool = setting(False, "an inclusion group keeps the members with the most key hits", "flag")
    world_cap: int = setting(20, "keyword engine: at most this many world lore entries", "count")
    character_cap: int = setting(15, "keyword engine: at most this many character lore entries", "count")
    strategy: str = setting(
        "character_first",
        'sillytavern engine: whose lore is admitted first: "character_first", "global_first" or "evenly" (by order)',
        "strategy",
    )

    def rules(self) -> LoreRules:
        """Lore's rules for these settings: "auto" becomes the engine's default."""
        engine: Engine = "sillytavern" if self.engine == "sillytavern" else "keyword"
        auto = ENGINE_DEFAULTS[engine]
        return LoreRules(
            engine=engine,
            scan_depth=int(auto["scan_depth"]) if self.scan_depth == "auto" else self.scan_depth,
            budget=self.budget,
            budget_cap=self.budget_cap,
            recursive=bool(auto["recursive"]) if self.recursive == "auto" else self.recursive,
            max_recursion_steps=self.max_recursion_steps,
            case_sensitive=self.case_sensitive,
            match_whole_words=bool(auto["match_whole_words"])
            if self.match_whole_words == "auto"
            else self.match_whole_words,
            include_names=self.include_names,
            min_activations=self.min_activations,
            min_activations_depth_max=self.min_activations_depth_max,
            group_scoring=self.group_scoring,
            world_cap=self.world_cap,
            character_cap=self.character_cap,
            strategy=cast(Strategy, self.strategy),  # checked against STRATEGIES when read
        )


@dataclass(frozen=True)
class SummarizeSettings:
    """`[summarize]`: `ctx summarize`, which writes scene summaries and histories with the
    user's own model server (docs/summarize.md)."""

    url: str = setting("", "the model server's OpenAI-compatible base URL, e.g. http://127.0.0.1:8080/v1", "text")
    model: str = setting("", 'the "model" asked for (the server\'s name for it)', "text")
    api_key_env: str = setting("", "the NAME of the environment variable holding the API key; empty: no key", "text")
    window: int = setting(0, "the summarizer's context in tokens; 0 = ask the server, else 8192", "count")
    timeout: float = setting(300.0, "seconds to wait for each reply", "seconds")
    connect_timeout: float = setting(10.0, "seconds to wait for a connection", "seconds")
    settle: int = setting(20, "the newest messages never summarized", "count")
    min_chars: int = setting(6000, "a scene holds at least this many characters of text", "count", least=1)
    min_messages: int = setting(20, "and at least this many messages", "count", least=1)
    summary_words: int = setting(400, "a scene's summary: at most this many words", "count", least=20)
    history_words: int = setting(200, "a history (the story so far): at most this many words", "count", least=20)
    summary_prompt: str = setting("", "the summary prompt file; empty: the shipped prompts/summary.md", "text")
    history_prompt: str = setting("", "the history prompt file; empty: the shipped prompts/history.md", "text")
    jobs: int = setting(1, "scene requests sent at once (llama.cpp -np, vLLM, hosted APIs)", "count", least=1)
    temperature: float = setting(0.2, "the sampling temperature of every request", "factor")
    repeat_penalty: float = setting(0.0, "llama.cpp's repeat_penalty, sent when > 0 (1.1 for small models)", "factor")
    attempts: int = setting(3, "tries for a reply with a usable summary before it is reported", "count", least=1)
    scene_breaks: tuple[str, ...] = setting(
        (), "patterns of a time skip opening a message (a scene cut); empty: English ones", "patterns"
    )
    date_gap: float = setting(
        6.0, "hours between two messages' send_date (SillyTavern's) that cut a scene there; 0 = none", "hours"
    )
    fallback: str = setting(
        "extract", 'when no reply would do: "extract" (the scene\'s own lines) or "none" (left missing)', "fallback"
    )


@dataclass(frozen=True)
class RecallSettings:
    """`[recall]`: the embeddings of seed 000's RAG Infill Engine (docs/lore.md, "Recall by
    meaning"). Off while `url` or `model` is empty: the keyword engine recalls alone."""

    url: str = setting(
        "", "the embeddings server's base URL: OpenAI-style (…/v1/embeddings) or Ollama's; empty: keywords only", "text"
    )
    model: str = setting("", 'the embedding "model" asked for (the server\'s name for it)', "text")
    api_key_env: str = setting("", "the NAME of the environment variable holding the API key; empty: no key", "text")
    timeout: float = setting(5.0, "seconds a turn waits for its question's embedding; then keywords", "seconds")
    batch: int = setting(32, "texts a request when the story's vectors are written", "count", least=1)

    @property
    def on(self) -> bool:
        return bool(self.url.strip() and self.model.strip())


@dataclass(frozen=True)
class ServeSettings:
    """`[serve]`: `ctx serve`, the OpenAI-compatible server between the user's frontend and their
    model server (docs/serve.md)."""

    backend: str = setting("", "the model server's OpenAI-compatible base URL, e.g. http://127.0.0.1:8080/v1", "text")
    host: str = setting("127.0.0.1", "the address to listen on; any other than loopback needs api_key_env", "text")
    port: int = setting(8765, "the port to listen on; 0: any free port", "count")
    model: str = setting("", 'the "model" sent to the backend; empty: the request\'s own', "text")
    api_key_env: str = setting(
        "", "the NAME of the environment variable holding the key clients must send; empty: none", "text"
    )
    backend_key_env: str = setting(
        "", "the NAME of the environment variable holding the backend's API key; empty: none", "text"
    )
    summarize: bool = setting(True, "write scene summaries in the background while no request waits", "flag")
    timeout: float = setting(300.0, "seconds to wait for the backend's reply (between streamed chunks)", "seconds")
    connect_timeout: float = setting(10.0, "seconds to wait for a connection to the backend", "seconds")
    max_body: int = setting(64 << 20, "the largest request body accepted, in bytes (413 beyond)", "count", least=1024)
    chat_messages: int = setting(2, "the opening messages that identify a chat (its frame does not)", "count")
    stable_frame: bool = setting(
        True, "the frame's parts that come and go (fired World Info) go at frame_depth, the rest first", "flag"
    )
    frame_depth: int | Literal["tail"] = setting(
        "tail",
        "where the frame's moving parts go: \"tail\" (before the tail's first message) or N messages from the end",
        "placement",
    )
    frame_sticky: int = setting(
        16,
        "stable_frame: messages a frame part the frontend stops sending (an entry that no longer fires) stays; 0: none",
        "count",
    )
    depth_hold: int = setting(
        2,
        "a system message inside the chat sent N messages from the end (an Author's Note) stays where it was"
        " until it is N x depth_hold from the end; 1: where sent",
        "count",
        least=1,
    )
    shutdown: float = setting(60.0, "on SIGTERM, seconds in-flight replies get to finish", "seconds")


SECTIONS: dict[
    str,
    type[ContextSettings]
    | type[PromptSettings]
    | type[ModelSettings]
    | type[LoreSettings]
    | type[SummarizeSettings]
    | type[RecallSettings]
    | type[ServeSettings],
] = {
    "context": ContextSettings,
    "prompt": PromptSettings,
    "model": ModelSettings,
    "lore": LoreSettings,
    "summarize": SummarizeSettings,
    "recall": RecallSettings,
    "serve": ServeSettings,
}


def keys(section: str) -> tuple[Field[Any], ...]:
    return fields(SECTIONS[section])


@dataclass(frozen=True)
class Settings:
    """The effective settings. `sources` maps "section.key" to where its value came from: "default",
    the config file, or the command-line label it was given with; `given` holds the keys set on
    the command line."""

    context: ContextSettings = ContextSettings()
    prompt: PromptSettings = PromptSettings()
    model: ModelSettings = ModelSettings()
    lore: LoreSettings = LoreSettings()
    summarize: SummarizeSettings = SummarizeSettings()
    recall: RecallSettings = RecallSettings()
    serve: ServeSettings = ServeSettings()
    sources: Mapping[str, str] = field(default_factory=dict)
    given: frozenset[str] = frozenset()
    path: Path | None = None  # the file that was read, if any

    def rows(self) -> Iterator[tuple[str, Any, str]]:
        """(section.key, value, where it came from), in schema order."""
        for section in SECTIONS:
            values = getattr(self, section)
            for key in keys(section):
                dotted = f"{section}.{key.name}"
                yield dotted, getattr(values, key.name), self.sources.get(dotted, "default")


class _Check:
    """One value being validated: `wrong` makes the error that names it."""

    def __init__(self, dotted: str, value: Any, bad: type[ConfigError], source: str, least: int) -> None:
        self.dotted, self.value, self.bad, self.source, self.least = dotted, value, bad, source, least

    def wrong(self, expected: str) -> ConfigError:
        value = self.value
        shown = json.dumps(value, ensure_ascii=False) if isinstance(value, str | bool) else repr(value)
        if isinstance(value, int | float) and not isinstance(value, bool):
            shown = f"{value}" if len(str(value)) < 40 else "a number too large to use"
        return self.bad(self.source, self.dotted, f"expected {expected}, got {shown}")


def _count(c: _Check, expected: str = "") -> int:
    v = c.value
    if isinstance(v, bool) or not isinstance(v, int) or not c.least <= v <= MOST:
        raise c.wrong(expected or f"a whole number from {c.least} to {MOST:,}")
    return v


def _depth(c: _Check) -> Any:
    return c.value if c.value == "auto" else _count(c, 'a number of messages ≥ 0 or "auto"')


def _placement(c: _Check) -> Any:
    return c.value if c.value == "tail" else _count(c, 'a number of messages ≥ 0 or "tail"')


def _reserve(c: _Check) -> Any:
    if c.value == "auto":
        return c.value
    if isinstance(c.value, str) and re.fullmatch(r"[0-9]{1,10}", c.value):  # from a flag: --reserve 800
        c.value = int(c.value)
    return _count(c, 'a number of tokens ≥ 0 or "auto"')


def _flag(c: _Check) -> Any:
    if not isinstance(c.value, bool):
        raise c.wrong("true or false")
    return c.value


def _switch(c: _Check) -> Any:
    if c.value != "auto" and not isinstance(c.value, bool):
        raise c.wrong('true, false or "auto"')
    return c.value


def _factor(c: _Check) -> float:
    v = c.value
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not 0 <= v <= 100:
        raise c.wrong("a number from 0 to 100")
    return float(v)


def _share(c: _Check) -> float:
    v = c.value
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 1:
        raise c.wrong("a share of the limit from 0 to below 1")
    return float(v)


def _files(c: _Check) -> tuple[str, ...]:
    value = [c.value] if isinstance(c.value, str | Path) else c.value
    if not isinstance(value, list | tuple) or not all(isinstance(v, str | Path) for v in value):
        raise c.wrong("a list of file paths")
    base = Path(c.source).parent if c.bad is ConfigError and Path(c.source).suffix == ".toml" else None
    return tuple(str(base / Path(v).expanduser()) if base else str(Path(v).expanduser()) for v in value)


def _patterns(c: _Check) -> tuple[str, ...]:
    """Regular expressions, each one checked here (a typo is named now, not mid-run)."""
    value = [c.value] if isinstance(c.value, str) else c.value
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
        raise c.wrong("a list of regular expressions")
    for pattern in value:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise c.wrong(f"regular expressions; {pattern!r} is not one ({exc})") from None
    return tuple(value)


def _seconds(c: _Check) -> float:
    v = c.value
    if isinstance(v, str):  # from a flag
        try:
            v = float(v)
        except ValueError:
            raise c.wrong("a number of seconds above 0") from None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not 0 < v <= 86_400:
        raise c.wrong("a number of seconds above 0, at most 86,400 (a day)")
    return float(v)


def _hours(c: _Check) -> float:
    v = c.value
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not 0 <= v <= 8760:
        raise c.wrong("a number of hours from 0 to 8,760 (a year)")
    return float(v)


def _text(c: _Check) -> str:
    if not isinstance(c.value, str):
        raise c.wrong("text")
    return c.value


def _tokenizer(c: _Check) -> str:
    """A counter's name (`tokens`' own, or "server") or a tokenizer file, found when it is used."""
    names = (*TOKENIZERS, "server")
    if not isinstance(c.value, str) or c.value not in names and not Path(c.value).expanduser().exists():
        raise c.wrong(", ".join(f'"{name}"' for name in names) + " or a tokenizer file that exists")
    return c.value


def _one_of(choices: Sequence[str]) -> Callable[[_Check], str]:
    def check(c: _Check) -> str:
        if c.value not in choices:
            raise c.wrong(" or ".join(f'"{choice}"' for choice in choices))
        return str(c.value)

    return check


# What each kind of setting accepts. The lists of choices are the owners' own: the cache
# policies the assembler has, the lore engines lore has, the tokenizers `tokens` can make.
CHECKS: dict[str, Callable[[_Check], Any]] = {
    "count": _count,
    "depth": _depth,
    "placement": _placement,
    "reserve": _reserve,
    "flag": _flag,
    "switch": _switch,
    "factor": _factor,
    "share": _share,
    "files": _files,
    "patterns": _patterns,
    "fallback": _one_of(("extract", "none")),
    "speakers": _one_of(SPEAKERS),
    "text": _text,
    "seconds": _seconds,
    "hours": _hours,
    "cache": _one_of(CACHES),
    "engine": _one_of(ENGINES),
    "strategy": _one_of(STRATEGIES),
    "tokenizer": _tokenizer,
}


def _check(dotted: str, key: Field[Any], value: Any, bad: type[ConfigError], source: str) -> Any:
    """Validate one value against its field; return it normalised."""
    return CHECKS[key.metadata["kind"]](_Check(dotted, value, bad, source, key.metadata["least"]))


def load_settings(
    path: Path | None = None,
    overrides: Mapping[str, tuple[Any, str]] | None = None,
    *,
    explicit: bool = False,
    reader: Callable[[Path], bytes] | None = None,
) -> Settings:
    """Defaults, then the config file (if it exists), then `overrides` given on the command line
    ({"section.key": (value, label)}; a bad value there is a usage error).

    `explicit` means the user named the file (`--config`): then a missing file is an error.
    `reader` reads the file's bytes: the CLI's (`files.read_input`) refuses devices, never
    blocks on a FIFO and records the file as an input of the run, so `-o` never replaces it.
    """
    values: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
    sources: dict[str, str] = {}
    path = path or config_path()
    read: Path | None = None
    try:
        mode: int | None = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    except OSError as exc:  # a folder on the way the user cannot search
        raise ConfigError(str(path), None, f"cannot be read: {exc.strerror or exc}") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise ConfigError(str(path), None, "is a directory; name the config file inside it")
    if mode is not None:  # a file, or a pipe: `--config <(...)`
        _apply_file(path, _read_toml(path, reader), values, sources)
        read = path
    elif explicit:
        raise ConfigError(str(path), None, "no such config file (run `ctx config init` to write one)")
    for dotted, (value, label) in (overrides or {}).items():
        section, name = dotted.split(".", 1)
        key = next(k for k in keys(section) if k.name == name)
        values[section][name] = _check(dotted, key, value, UsageError, label)
        sources[dotted] = label
    return Settings(
        context=ContextSettings(**values["context"]),
        prompt=PromptSettings(**values["prompt"]),
        model=ModelSettings(**values["model"]),
        lore=LoreSettings(**values["lore"]),
        summarize=SummarizeSettings(**values["summarize"]),
        recall=RecallSettings(**values["recall"]),
        serve=ServeSettings(**values["serve"]),
        sources=sources,
        given=frozenset(overrides or ()),
        path=read,
    )


CONFIG_BOUND = 1 << 20  # files.BOUNDS["config file"]: a config file is a few lines of TOML


def _read_toml(path: Path, reader: Callable[[Path], bytes] | None = None) -> dict[str, Any]:
    """The file's TOML, a UTF-8 byte-order mark dropped as every JSON reader drops it."""
    try:
        if reader is None:
            with path.open("rb") as handle:
                data = handle.read(CONFIG_BOUND + 1)
        else:
            data = reader(path)
        if len(data) > CONFIG_BOUND:
            raise ConfigError(str(path), None, "is larger than the 1 MiB a config file may be; is it the right file?")
        return tomllib.loads(data.decode("utf-8").removeprefix("\ufeff"))
    except UnicodeDecodeError:
        raise ConfigError(str(path), None, "is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), None, f"is not valid TOML: {exc}") from None
    except (RecursionError, ValueError) as exc:  # absurd nesting; a number of thousands of digits
        raise ConfigError(
            str(path), None, f"is not a config file ({type(exc).__name__}: nested or sized past reason)"
        ) from None
    except OSError as exc:
        raise ConfigError(str(path), None, f"cannot be read: {exc.strerror or exc}") from None


def _apply_file(path: Path, data: dict[str, Any], values: dict[str, dict[str, Any]], sources: dict[str, str]) -> None:
    for section, table in data.items():
        if section not in SECTIONS:
            raise ConfigError(
                str(path), section, f"unknown section; expected one of {', '.join(f'[{s}]' for s in SECTIONS)}"
            )
        if not isinstance(table, dict):
            raise ConfigError(str(path), section, "expected a [section] table")
        known = {k.name: k for k in keys(section)}
        for name, value in table.items():
            dotted = f"{section}.{name}"
            if name not in known:
                raise ConfigError(str(path), dotted, f"unknown key; [{section}] takes {', '.join(known)}")
            values[section][name] = _check(dotted, known[name], value, ConfigError, str(path))
            sources[dotted] = str(path)


def default_toml() -> str:
    """The documented default config file (what `ctx config init` writes), via tomli-w."""
    import tomli_w

    lines = [
        "# otaku-ctx settings (~/.otaku/configs/config.toml). Every value here is the built-in",
        "# default; delete a line to keep the default, change it to override.",
        "",
    ]
    for section in SECTIONS:
        lines.append(f"[{section}]")
        for key in keys(section):
            line = tomli_w.dumps({key.name: key.default}, multiline_strings=True).strip()
            serves = SERVE_DEFAULTS.get(f"{section}.{key.name}")
            if serves is None:
                lines += [f"# {key.metadata['help']}", line]
            else:  # left unset, so each command takes its own default
                shown = tomli_w.dumps({key.name: serves}).strip().split(" = ", 1)[1]
                lines += [
                    f"# {key.metadata['help']}; unset: {line.split(' = ', 1)[1]}, in ctx serve {shown}",
                    f"# {line}",
                ]
        lines.append("")
    return "\n".join(lines)


#: the settings whose default in `ctx serve` is its own (a server's chat keeps its prefix, and
#: carries the names its frontend sent): serve takes these while the setting is unset, and a
#: value the user set wherever it is set; `config init` writes them commented out
SERVE_DEFAULTS: dict[str, Any] = {"context.cache": "stable", "context.recall": 0.03, "prompt.speakers": "as_given"}
