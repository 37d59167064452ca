"""`ctx config init` and `ctx config show`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from .examples import EXAMPLES
from .options import AsJson, ConfigPath, Debug, Force, named, settings_from
from .terminal import show, terminal, write_stdout

config_app = typer.Typer(no_args_is_help=True, help="Write or show the settings.")


@config_app.command("init", epilog=EXAMPLES["config init"])
def config_init(
    force: Force = False,
    config: Annotated[
        str | None,
        typer.Option("--config", metavar="FILE", help="Write here instead of ~/.otaku/configs/config.toml."),
    ] = None,
    debug: Debug = False,
) -> None:
    """Write the documented default config file."""
    from ..config import default_toml
    from ..errors import ConfigError
    from ..files import write_atomic
    from ..locations import config_path

    given = named(config, "--config", "an empty path; name the config file to write")
    path = Path(given).expanduser() if config is not None else config_path()
    if path.exists() and not force:
        raise ConfigError(str(path), None, "already exists; pass --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, default_toml())
    terminal().say(f"wrote {path}")


@config_app.command("show", epilog=EXAMPLES["config show"])
def config_show(config: ConfigPath = None, as_json: AsJson = False, debug: Debug = False) -> None:
    """Print the effective settings and where each came from."""
    rows = list(settings_from(config).rows())
    if as_json:
        out = {name: {"value": value, "from": source} for name, value, source in rows}
        write_stdout(json.dumps(out, ensure_ascii=False, indent=2) + "\n")
        return
    shown = [(name, json.dumps(value, ensure_ascii=False), source) for name, value, source in rows]
    if terminal().stdout_tty:
        from .views import settings_table

        show(settings_table(shown))
    else:  # a pipe gets every row whole, one per line, tab-separated
        write_stdout("".join("\t".join(row) + "\n" for row in shown))
