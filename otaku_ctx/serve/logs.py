"""What `ctx serve` writes on stderr: one visible line a record, and never a flood.

A serve log line quotes what others said — a backend's error, a client's malformed request,
aiohttp's own complaint about a connection — so each is made safe to print (`Visible`: every
character that steers a terminal shown as its escape, an exception as one line, a traceback only
with `--debug`), and a client or backend that makes the same fault a thousand times a second
gets a few lines of it, then one that counts the rest (`Hush`). The one line a turn is written
every time: it is the turn's record, not a fault.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Sequence

from ..errors import visible

#: lines of one kind (a logger's message) written in `WINDOW` seconds before the rest are counted
MOST_A_WINDOW = 5
WINDOW = 60.0
#: the kinds of line counted at once (the messages are the code's own; this is a bound, not a need)
MOST_KINDS = 1000


class Visible(logging.Formatter):
    """`ctx serve: ` and the record's message made visible; its exception as one line (its type
    and its words), or with `debug`, its traceback."""

    def __init__(self, debug: bool = False) -> None:
        super().__init__()
        self.debug = debug

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        failure = record.exc_info[1] if record.exc_info else None
        if failure is not None and not self.debug:
            said = str(failure).splitlines()[0] if str(failure) else ""
            message += f" ({type(failure).__name__}{': ' + said if said else ''})"
        lines = [visible(message)]
        if failure is not None and self.debug and record.exc_info:
            lines += [visible(line) for line in self.formatException(record.exc_info).splitlines()]
        return "\n".join(f"ctx serve: {line}" for line in lines)


class Hush(logging.Filter):
    """At most `most` lines of each kind (a logger and its message before its arguments) in
    `window` seconds; the first after that says how many were left out."""

    def __init__(
        self, most: int = MOST_A_WINDOW, window: float = WINDOW, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.most, self.window, self.clock = most, window, clock
        self._kinds: dict[tuple[str, str], tuple[float, int, int]] = {}  # kind -> (since, written, left out)

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "every", False):  # one a turn (`record.EVERY`): each is its turn's record
            return True
        kind = (record.name, str(record.msg)[:200])
        now = self.clock()
        since, written, left = self._kinds.get(kind, (now, 0, 0))
        if now - since >= self.window:
            if left:
                record.msg = f"{record.msg} ({left:,} more like it left out in the {self.window:g} s before)"
            since, written, left = now, 0, 0
        if written >= self.most:
            self._kinds[kind] = (since, written, left + 1)
            return False
        if kind not in self._kinds and len(self._kinds) >= MOST_KINDS:
            self._kinds.clear()
        self._kinds[kind] = (since, written + 1, left)
        return True


def log_to_stderr(debug: bool = False) -> logging.Handler:
    """serve's log on stderr: INFO and up, each line visible, each kind hushed past its bound."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(Visible(debug))
    handler.addFilter(Hush())
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    return handler


#: characters of a chat's text that, found in what a server said, are a quote of the chat
QUOTED = 24


def unquoted(said: str, texts: Sequence[str]) -> str:
    """What a server said, cut where it starts quoting one of `texts` (the prompt's messages): a
    backend's error may quote the prompt, and a chat's text is never logged. `said` is one
    line of a few hundred characters (`failures.one_line`); each window of it is looked for."""
    step = QUOTED // 2
    for start in range(0, max(0, len(said) - QUOTED) + 1, step):
        window = said[start : start + QUOTED]
        if len(window) == QUOTED and any(window in text for text in texts):
            return said[:start].rstrip() + " … (the prompt, quoted: cut)"
    return said
