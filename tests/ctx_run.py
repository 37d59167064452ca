"""`ctx ARGV` in-process, as the file and server tests run it: its own terminal over byte
buffers (stdin given or empty), and the one-line error every refusal ends in."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from otaku_ctx.cli.app import main
from otaku_ctx.cli.terminal import Terminal


def ctx(*argv: str | Path, stdin: Any = None) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `ctx ARGV`, stdin a binary file or empty."""
    out, err = io.BytesIO(), io.StringIO()
    status = main([str(a) for a in argv], Terminal(stdin or io.BytesIO(), out, err))
    return status, out.getvalue().decode("utf-8"), err.getvalue()


def one_line(err: str) -> str:
    """`err`, once it is checked to be one `ctx: ` line with no traceback."""
    assert err.count("\n") == 1 and err.startswith("ctx: ") and "Traceback" not in err, err
    return err
