"""What `ctx` exits with (README: "Exit codes"). Errors carry theirs; the CLI and `__main__` use these."""

from __future__ import annotations

from enum import IntEnum


class ExitStatus(IntEnum):
    OK = 0
    ERROR = 1  # bad input, a bad config file, an I/O error
    USAGE = 2  # a bad flag or flag value
    REFUSED = 3  # case 6: nothing fits
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
    BROKEN_PIPE = 141  # the reader of stdout went away (128 + SIGPIPE), as a tool killed by SIGPIPE reports
