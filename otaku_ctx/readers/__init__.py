"""Story readers: every supported file becomes the same `Story`."""

from __future__ import annotations

from pathlib import Path

from ..errors import StoryError
from ..model import Story
from .native import Problem, check_native, read_native

READERS = {"native": read_native}


def read_story(path: Path | str, source_format: str | None = None) -> Story:
    """Read a story file; `source_format` overrides detection by content."""
    path = Path(path)
    name = source_format or "native"
    reader = READERS.get(name)
    if reader is None:
        raise StoryError(path, None, f"unknown story format {name!r}; expected one of {', '.join(READERS)}")
    return reader(path)


__all__ = ["Problem", "READERS", "check_native", "read_native", "read_story"]
