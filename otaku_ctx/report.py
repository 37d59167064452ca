"""The facts of an assembly as plain data: what `ctx inspect --json` prints and the Rich view draws."""

from __future__ import annotations

from typing import Any

from .assembler import Assembly
from .build import Built, refusal_message


def _range(messages) -> dict[str, int] | None:  # noqa: ANN001 - a tuple of Message
    return {"first": messages[0].number, "last": messages[-1].number} if messages else None


def facts(built: Built, story_hidden: int = 0) -> dict[str, Any]:
    """Everything `inspect` knows, JSON-ready. Scene ids are the scene's `id`, else its order."""
    a: Assembly = built.assembly
    history = a.history
    data: dict[str, Any] = {
        "case": a.case,
        "messages": a.messages,
        "hidden": story_hidden,
        "limit": a.limit,
        "tokens": a.tokens,
        "window": built.budget.window,
        "max_context": built.budget.max_context,
        "reserve": built.budget.reserve,
        "reserve_source": built.budget.reserve_source,
        "tokenizer": built.tokenizer,
        "head": _range(a.head),
        "summaries": [s.ref for s in a.summaries],
        "history": {"through_scene": history.ref} if history else None,
        "floated_cards": [m.number for m in a.floated_cards],
        "cards": [p.message.number for p in a.recap if p.kind == "card" and p.message],
        "tail": _range(a.tail),
        "tail_target": a.tail_target,
        "level": a.level,
        "sections": a.costs,
        "steps": list(a.steps),
    }
    if a.refusal:
        r = a.refusal
        data["refusal"] = {
            "smallest": r.smallest,
            "needed_context": r.needed_context,
            "missing_summaries": list(r.missing_summaries),
            "missing_histories": list(r.missing_histories),
            "message": refusal_message(r, built.budget),
        }
    return data
