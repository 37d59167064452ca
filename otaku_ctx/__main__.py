"""`ctx` and `python -m otaku_ctx`: answer `--version` at once, else hand over to the CLI."""

from __future__ import annotations

import sys


def entry() -> None:
    """The console script. `ctx --version` needs nothing but the version, so it imports nothing."""
    argv = sys.argv[1:]
    if argv == ["--version"]:
        from . import __version__

        sys.stdout.write(f"ctx {__version__}\n")
        sys.exit(0)
    from .cli import main

    sys.exit(main(argv))


if __name__ == "__main__":
    entry()
