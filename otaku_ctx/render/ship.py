"""Regenerate the shipped programs: `python -m otaku_ctx.render.ship` after editing a shipped template
(configs/templates/*.hbs or `DEFAULT_CARD_TEMPLATE`) or the engine. A test fails while they are stale."""

from __future__ import annotations

from pathlib import Path

from ..config import DEFAULT_CARD_TEMPLATE
from ..hbs.store import artefact, dumps, template_key
from ..locations import shipped

CARD_LABEL = "otaku_ctx.config.DEFAULT_CARD_TEMPLATE"


def shipped_sources(templates: Path) -> dict[str, str]:
    """Each shipped template's source, by a label naming where it comes from."""
    sources = {f"configs/templates/{path.name}": path.read_text(encoding="utf-8") for path in templates.glob("*.hbs")}
    return dict(sorted(sources.items())) | {CARD_LABEL: DEFAULT_CARD_TEMPLATE}


def shipped_programs(templates: Path) -> dict[str, str]:
    """File name -> content, for every shipped template, compiled now."""
    from ..hbs.compile import compile_program

    files = {}
    for label, source in shipped_sources(templates).items():
        files[f"{template_key(source)}.json"] = dumps(artefact(source, compile_program(source, label), label))
    return files


def main() -> None:
    folder = shipped("templates/compiled")
    folder.mkdir(parents=True, exist_ok=True)
    wanted = shipped_programs(folder.parent)
    for stale in folder.glob("*.json"):
        if stale.name not in wanted:
            stale.unlink()
    for name, text in wanted.items():
        (folder / name).write_text(text, encoding="utf-8")
    print(f"{len(wanted)} programs in {folder}")


if __name__ == "__main__":
    main()
