"""`ctx` and `python -m otaku_ctx`: answer `--version` at once, else hand over to the CLI."""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from .status import ExitStatus


def entry() -> None:
    """The console script. `ctx --version` needs nothing but the version, so it imports nothing else."""
    argv = sys.argv[1:]
    if argv == ["--version"]:
        from . import __version__

        sys.stdout.write(f"ctx {__version__}\n")
        sys.exit(0)
    from .cli.app import main

    leave(main(argv))


def leave(code: int) -> NoReturn:
    """Flush what was printed and end the process without tearing it down.

    By the time `main` returns, every file it wrote is closed and renamed into place and its
    progress timer is stopped; only stdout and stderr may still hold bytes. Freeing the rest
    (the tokenizer's tables, every module) is what an ordinary exit would do next, and it
    costs 30 to 50 ms a run for nothing. The stdout flush is the last place a closed pipe can
    show itself: it ends with the broken-pipe status, as a write during the build would.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except BrokenPipeError:
            code = ExitStatus.BROKEN_PIPE if stream is sys.stdout else code
        except (OSError, ValueError):  # a stream already closed or failing: nothing left to save
            pass
    os._exit(code)


if __name__ == "__main__":
    entry()
