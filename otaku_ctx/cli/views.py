"""Rich views for people at a terminal (`inspect --explain`, `config show`). Data, never markup,
goes to pipes: these are only used for the human-facing forms."""

from __future__ import annotations

from typing import IO, Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

CASES = {
    1: "case 1 — the story is short: everything verbatim",
    2: "case 2 — no scene is summarised yet: everything verbatim",
    3: "case 3 — head, scene summaries, tail",
    4: "case 4 — head, story so far (history), remaining summaries, tail",
    5: "case 5 — the tail is shortened to fit",
    6: "case 6 — refused: nothing fits",
}


def _span(r: dict[str, int] | None) -> str:
    if not r:
        return "—"
    return f"{r['first']:,}–{r['last']:,}" if r["first"] != r["last"] else f"{r['first']:,}"


def _ids(ids: list[int | str]) -> str:
    """Scene ids or message numbers, runs of consecutive numbers shortened: 5–17, 20."""
    if not ids:
        return "—"
    runs: list[list[int | str]] = []
    for i in ids:
        if runs and isinstance(i, int) and isinstance(runs[-1][-1], int) and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)


def _scene_runs(scenes: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Consecutive scenes of one source that the prompt uses alike, as one run."""
    runs: list[list[dict[str, Any]]] = []
    for scene in scenes:
        if runs and (runs[-1][-1]["source"], runs[-1][-1]["used"]) == (scene["source"], scene["used"]):
            runs[-1].append(scene)
        else:
            runs.append([scene])
    return runs


def scenes_table(scenes: list[dict[str, Any]]) -> Table:
    """The story's scenes in runs: which, their messages, where their summaries and histories
    came from, and what the prompt uses of them."""
    table = Table(title="Scenes", show_edge=False, expand=False)
    for column in ("scenes", "messages", "from", "in the prompt"):
        table.add_column(column)
    for run in _scene_runs(scenes):
        ids = _ids([s["id"] for s in run])
        messages = _span({"first": run[0]["start"], "last": run[-1]["end"]})
        used = {"summary": "summaries", "history": "history"}.get(run[0]["used"] or "", "—")
        table.add_row(ids, messages, run[0]["source"], used if len(run) > 1 or used == "—" else run[0]["used"])
    return table


def explain(facts: dict[str, Any], *, steps: bool = True) -> Group:
    """The case, each section with its range and tokens, the budget, and (with `steps`) every
    step of the search."""
    title = Text(CASES[facts["case"]], style="bold red" if facts["case"] == 6 else "bold")
    sections = Table(title="Sections", show_edge=False, expand=False)
    sections.add_column("section")
    sections.add_column("what")
    sections.add_column("tokens", justify="right")
    costs = facts.get("sections") or {}
    sections.add_row("system & framing", "", f"{costs['fixed']:,}" if "fixed" in costs else "")
    sections.add_row("head", f"messages {_span(facts['head'])}", f"{costs['head']:,}" if "head" in costs else "")
    recap = []
    if facts["floated_cards"]:
        recap.append(f"floated cards {_ids(facts['floated_cards'])}")
    if facts["history"]:
        recap.append(f"history through scene {facts['history']['through_scene']}")
    if facts["summaries"]:
        recap.append(f"summaries of scenes {_ids(facts['summaries'])}")
    in_recap = [c for c in facts["cards"] if c not in facts["floated_cards"]]
    if in_recap:
        recap.append(f"cards {_ids(in_recap)} before their scenes")
    sections.add_row("recap", "; ".join(recap) or "—", f"{costs['recap']:,}" if "recap" in costs else "")
    sections.add_row(
        "tail",
        f"messages {_span(facts['tail'])} (target {facts['tail_target']})",
        f"{costs['tail']:,}" if "tail" in costs else "",
    )
    budget = Table(title="Budget", show_header=False, show_edge=False)
    budget.add_column()
    budget.add_column(justify="right")
    context = facts["window"] if not facts["max_context"] else min(facts["window"], facts["max_context"])
    budget.add_row("used" if facts["case"] != 6 else "smallest reached", f"{facts['tokens']:,}")
    budget.add_row("limit", f"{facts['limit']:,}")
    budget.add_row("reserve", f"{facts['reserve']:,} ({facts['reserve_source']})")
    budget.add_row("context", f"{context:,} (window {facts['window']:,}, max_context {facts['max_context']:,})")
    generic = "" if facts.get("tokenizer_is_the_models", True) else " (OpenAI's count, not your model's: --use MODEL)"
    budget.add_row("tokenizer", facts["tokenizer"] + generic)
    budget.add_row(
        "messages", f"{facts['messages']:,}" + (f" (+{facts['hidden']} hidden)" if facts.get("hidden") else "")
    )
    parts: list[Any] = [title]
    if facts.get("refusal"):
        parts.append(Text(facts["refusal"]["message"]))
    parts += [Text(), sections, Text(), budget]
    if facts.get("scenes"):
        parts += [Text(), scenes_table(facts["scenes"])]
    lore = facts.get("lore") or {}
    if lore.get("entries"):
        table = Table(title=f"Lore ({lore['engine']}: {lore['used']:,} of {lore['budget']:,} tokens)", show_edge=False)
        for column in ("entry", "placed", "why", "tokens"):
            table.add_column(column, justify="right" if column == "tokens" else "left")
        for e in lore["entries"]:
            name = e["comment"] or f"uid {e['uid']}"
            where = f"{e['position']}" + (f" @{e['depth']} {e['role']}" if e["depth"] is not None else "")
            table.add_row(name, where if e["placed"] else "—", e["why"], f"{e['tokens']:,}" if e["tokens"] else "")
        parts += [Text(), table]
    if not steps:
        return Group(*parts)
    listed = Text()
    for number, step in enumerate(facts["steps"], start=1):
        listed.append(f"{number:>2}. ", style="dim")
        listed.append(step + "\n")
    return Group(*parts, Text(), Panel(listed, title="Steps", expand=False))


def settings_table(rows: list[tuple[str, str, str]]) -> Table:
    table = Table(show_edge=False)
    table.add_column("setting")
    table.add_column("value")
    table.add_column("from")
    for row in rows:
        table.add_row(*row)
    return table


def console(stream: IO[str], *, color: bool, width: int | None = None) -> Console:
    """A console that writes to `stream`; colour only when asked (a terminal, no NO_COLOR)."""
    return Console(
        file=stream,
        highlight=False,
        soft_wrap=False,
        color_system="auto" if color else None,
        force_terminal=color,
        width=width,
    )


class progress_bar:  # noqa: N801 - used like a function
    """A transient, pulsing Rich progress bar with the current phase and the time taken."""

    def __init__(self, stream: IO[str], *, color: bool) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TimeElapsedColumn(),
            console=Console(file=stream, force_terminal=True, color_system="auto" if color else None),
            transient=True,
        )
        self.task = self.progress.add_task("", total=None)

    def start(self, phase: str) -> None:
        self.progress.update(self.task, description=phase)
        self.progress.start()

    def update(self, phase: str) -> None:
        self.progress.update(self.task, description=phase)

    def stop(self) -> None:
        self.progress.stop()
