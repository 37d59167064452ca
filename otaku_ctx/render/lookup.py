"""Finding templates and formats by name or path: the user's folder first, then the shipped ones."""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from ..errors import ConfigError, did_you_mean
from ..files import read_input, utf8_text
from ..hbs import Template, cached_template
from ..locations import search_dirs, shipped, template_cache
from .formats import Format, load_format
from .presets import PresetTemplate, read_context_preset, story_source
from .templates import HandlebarsTemplate, PromptTemplate


@lru_cache(maxsize=64)
def compiled(source: str, name: str) -> Template:
    """Compile once per run; parse only when no shipped or cached program has it (see hbs.store)."""
    return cached_template(source, name, shipped=shipped("templates/compiled"), cache=template_cache())


def load_template(name_or_path: str, dirs: Sequence[Path] | None = None) -> PromptTemplate:
    """A template by name (`default`, `serene`, `sillytavern`, or one of the user's) or path;
        a `.json` path is a SillyTavern context preset (its story string compiled and cached like
        a template; any other JSON is refused, naming what it is). A name is looked up in `dirs`,
    by default the user's templates folder and then the shipped one (`locations.search_dirs`)."""
    path = Path(name_or_path).expanduser()
    if path.suffix.lower() == ".json":
        preset = read_context_preset(path)
        return PresetTemplate(preset, compiled(story_source(preset), f"{path} (story_string)"))
    # A file is anything that is there and not a folder: `--template <(...)` is a pipe.
    if not (name_or_path.endswith(".hbs") or (path.exists() and not path.is_dir())):
        dirs = search_dirs("templates") if dirs is None else dirs
        found = [p for d in dirs if os.path.lexists(p := d / f"{name_or_path}.hbs")]
        if not found:  # a name that is there but no file (a device, a dangling link) is read, and named
            names = sorted({p.stem for d in dirs if d.is_dir() for p in d.glob("*.hbs")})
            guess = did_you_mean(name_or_path, names)
            raise ConfigError(
                name_or_path, None, f"no template named {name_or_path!r}{guess} (known: {', '.join(names)})"
            )
        path = found[0]
    # CRLF stays CRLF and a byte-order mark stays, as Handlebars.js reads a template.
    source = utf8_text(read_input(path, "template"), path, drop_bom=False)
    return HandlebarsTemplate(compiled(source, str(path)))


def find_format(name_or_path: str, dirs: Sequence[Path] | None = None) -> Format:
    """A format by name (looked up in `dirs`, by default the user's and then the shipped
    formats) or path."""
    return load_format(name_or_path, search_dirs("formats") if dirs is None else dirs)
