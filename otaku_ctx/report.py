"""The facts of an assembly in words and as plain data: the sentences of `inspect --explain`,
the refusal message, and what `ctx inspect --json` prints.

The assembler records what it decided as `Step` facts; every sentence about them is
written here, so the search stays free of prose and a view can say it differently.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .assemble import Assembly, Refusal, SceneRef
from .assemble.steps import (
    ChainFound,
    ChainStop,
    FitsRendered,
    HeadPriced,
    Held,
    LevelsOverflow,
    NoHistory,
    Recalled,
    Refused,
    SameChain,
    Step,
    SummariesOverflow,
    TailOverflow,
    Tried,
)
from .build import Budget, Built
from .lore import LoreChoice, LoreDecision, position_name, role_name
from .story.model import LorePosition, Message, Scene, Story

# ── Sentences ────────────────────────────────────────────────────────────────────────────


def span(refs: Sequence[SceneRef]) -> str:
    """A run of scenes: "3", "1–4", or "none"."""
    if not refs:
        return "none"
    return f"{refs[0]}" if refs[0] == refs[-1] else f"{refs[0]}–{refs[-1]}"


def numbers(ends: Sequence[int]) -> str:
    """Message numbers (first, last): "65–220", "7", or "none"."""
    if not ends:
        return "none"
    return f"{ends[0]:,}" if ends[0] == ends[-1] else f"{ends[0]:,}–{ends[-1]:,}"


def stop_reason(stop: ChainStop) -> str:
    """Why the summaries stop where they do."""
    match stop.kind:
        case "head_full":
            return f"the head holds all {stop.messages:,} messages"
        case "no_start":
            return f"no scene holds message {stop.first:,} (the first after the head)"
        case "gap":
            return f"messages {stop.first:,}–{stop.last:,} belong to no scene"
        case "reaches_tail":
            return (
                f"scene {stop.scene} ends at message {stop.last:,}, "
                f"not before message {stop.boundary:,} ({stop.messages:,} − {stop.target})"
            )
        case "no_summary":
            return f"scene {stop.scene} has no summary"
        case _:
            return "no more scenes"


def _tried(step: Tried) -> str:
    scenes = step.scenes
    if step.level is None:
        what = "everything verbatim"
    elif step.level == 0:
        what = f"level 0: summaries {span(scenes)}"
    else:
        kept = f", summaries {span(scenes[step.level :])} kept" if step.level < len(scenes) else ""
        replaced = span(scenes[: step.level])
        what = f"level {step.level}: summaries {replaced} replaced by scene {scenes[step.level - 1]}'s history{kept}"
    if step.fits:
        return f"{what} — {step.tokens:,} ≤ {step.limit:,} tokens"
    return f"{what} — {step.tokens:,} > {step.limit:,} tokens" + (" (rendered)" if step.rendered else "")


def _recalled(step: Recalled) -> str:
    asked = f"the newest messages as of message {step.at:,}"
    how = "recall by meaning and keywords" if step.engine == "meaning" else "recall"
    if step.why:
        how = f"recall by keywords alone ({step.why})"
    if not step.taken:
        left = f"{step.candidates:,} older messages and summaries left out"
        if step.engine == "meaning":
            return f"{how}: none of the {left} fits the {step.budget:,} tokens left for it"
        return f"{how}: none of the {left} shares a rare word with {asked}"
    shown = []
    near = step.near or (None,) * len(step.taken)
    for (kind, ref, who, score, words), close in zip(step.taken, near, strict=True):
        what = f"message {ref:,} ({who})" if kind == "message" and isinstance(ref, int) else f"scene {ref}'s summary"
        because = [f"meaning {close:.2f}"] if close is not None else []
        because += [", ".join(words[:4])] if words else []
        shown.append(f"{what}: {'; '.join(because) or 'fused rank'} (score {score:g})")
    return (
        f"{how}: {len(step.taken)} of {step.candidates:,} left out, for {asked} — {step.tokens:,} of "
        f"{step.budget:,} tokens: " + "; ".join(shown)
    )


def describe(step: Step, remedy: Remedy | None = None) -> str:
    """One step of the search as a sentence (a refusal with its `remedy`, when it has one)."""
    match step:
        case HeadPriced():
            return (
                f"head: messages {numbers(step.messages)} verbatim ({step.tokens:,} tokens); "
                f"system and framing {step.fixed:,} tokens; limit {step.limit:,}"
            )
        case ChainFound(target=target, scenes=()):
            return f"tail target {target}: no scene is covered ({stop_reason(step.stop)}); every message is verbatim"
        case ChainFound():
            return (
                f"tail target {step.target}: summaries cover scenes {span(step.scenes)} "
                f"(messages {numbers(step.messages)}); the chain stops: {stop_reason(step.stop)}"
            )
        case SameChain():
            same = span(step.scenes)
            return f"tail target {step.target}: covers the same scenes as before ({same}) — nothing new to try"
        case TailOverflow():
            return (
                f"tail target {step.target}: head and tail (messages {numbers(step.tail)}) "
                f"alone exceed {step.limit:,} tokens"
            )
        case Tried():
            return _tried(step)
        case SummariesOverflow():
            if step.room <= 0:
                why = "head, tail and cards leave no room for summaries"
            else:
                why = f"summaries {span(step.over)} alone take {step.tokens:,} of the {step.room:,} tokens left"
            return f"level 0 (summaries {span(step.scenes)}) cannot fit: {why}"
        case LevelsOverflow():
            levels = "level 1" if step.last == 1 else f"levels {step.first}–{step.last}"
            return f"{levels} cannot fit: the summaries they keep alone exceed the room"
        case NoHistory(levels=(level,), scenes=(scene,)):
            return f"level {level}: scene {scene} has no history — skipped"
        case NoHistory():
            return f"levels {step.levels[0]}–{step.levels[-1]}: scenes {span(step.scenes)} have no history — skipped"
        case FitsRendered():
            return (
                f"tail target {step.target}, level {step.level}: its parts add up to {step.priced:,}, "
                f"but the rendered prompt is {step.tokens:,} ≤ {step.limit:,} tokens"
            )
        case Held():
            covered = f"summaries of scenes {span(step.scenes)}" if step.scenes else "nothing covered"
            held = f", level {step.level}" if step.level else ""
            return (
                f"cache policy stable: tail target {step.target}{held} ({covered}), held since message "
                f"{step.since} after {step.changes} change{'s' * (step.changes != 1)} of shape; "
                f"{step.room:,} tokens of room (slack at a change: {step.slack:,}), about {step.turns} more "
                "messages before it must change"
            )
        case Recalled():
            return _recalled(step)
        case Refused():
            return "case 6: " + explain_refusal(step.refusal, remedy=remedy)
    raise TypeError(f"not a step: {step!r}")


@dataclass(frozen=True)
class Remedy:
    """What `ctx summarize` would do for a refusal: summarize messages `first`..`last`, those
    the summaries stop short of. `story` is the story as the user named it."""

    first: int
    last: int
    story: str | None = None

    @property
    def command(self) -> str:
        """`ctx summarize STORY`, quoted for a shell (a story from stdin has no file to name)."""
        if not self.story or self.story == "-":
            return "`ctx summarize` on the story's file"
        return f"`ctx summarize {shlex.quote(self.story)}`"


def remedy(assembly: Assembly, story: Story, shown: str | None = None) -> Remedy | None:
    """The remedy of a refusal that missing summaries stand in the way of, when `ctx summarize`
    would write them: the messages from the first after the covered chain (after the head when
    none) to the last a chain may cover at the floor (N − T − 1: message N − T stays in the
    tail). None when they start inside the story's own scenes (its scene lines, a SillyTavern
    memory): `ctx summarize` cuts scenes only after those, so a gap or a scene without a
    summary there is the story's to mend."""
    r = assembly.refusal
    if r is None or r.limit <= 0 or not (r.missing_summaries or r.chain_stop):
        return None
    first = assembly.tail[0].number if assembly.tail else assembly.messages + 1
    last = assembly.messages - assembly.tail_target - 1
    own = max((s.end for s in story.scenes if s.source != "sidecar"), default=0)
    return Remedy(first, last, shown) if own < first <= last else None


def explain_refusal(refusal: Refusal, raise_what: str = "the context", remedy: Remedy | None = None) -> str:
    """What happened and what would help; `raise_what` names the setting to raise. With a
    `remedy`, running `ctx summarize` comes first, then the context that would fit the prompt
    as it is."""
    if refusal.limit <= 0:
        return (
            f"nothing fits: the {refusal.reserve:,}-token reply reserve leaves no room in a context of "
            f"{refusal.context:,} tokens; lower --reserve or raise {raise_what}."
        )
    text = (
        f"nothing fits: the smallest prompt reached is {refusal.smallest:,} tokens, but the limit is "
        f"{refusal.limit:,} ({refusal.context:,} minus a {refusal.reserve:,}-token reply reserve). "
    )
    stop = f" (the summaries stop early: {stop_reason(refusal.chain_stop)})" if refusal.chain_stop else ""
    missing = []
    if refusal.missing_summaries:
        missing.append("scenes without a summary: " + ", ".join(map(str, refusal.missing_summaries)))
    if refusal.missing_histories:
        missing.append("scenes without a history: " + ", ".join(map(str, refusal.missing_histories)))
    if remedy is not None:
        covered = numbers((remedy.first, remedy.last))
        text += (
            f"Messages {covered} are not covered by scene summaries{stop}: run {remedy.command}. "
            f"Or a context of at least {refusal.needed_context:,} tokens would fit it as it is: raise {raise_what}"
        )
    else:
        text += f"A context of at least {refusal.needed_context:,} tokens would fit it: raise {raise_what}"
    if missing:
        text += "; or fill in what stands in the way (" + "; ".join(missing) + ")"
    elif remedy is None:
        text += stop
    return text + "."


# The counters that know no model: a count by them is OpenAI's (or a guess), not the model's.
GENERIC_COUNTERS = ("cl100k_base", "estimate")


def refusal_message(
    refusal: Refusal, budget: Budget, remedy: Remedy | None = None, alternatives: Sequence[str] = ()
) -> str:
    """The refusal with the setting that would help: max_context when it is what caps the
    context, else the model's window; `ctx summarize` first, when that would help (`remedy`);
    then the other settings that would make it fit (`Pipeline.alternatives`)."""
    capped = 0 < budget.max_context < budget.window
    what = f"max_context (now {budget.max_context:,})" if capped else f"--window (now {budget.window:,})"
    text = explain_refusal(refusal, what, remedy)
    if alternatives:
        text = text.removesuffix(".") + ". It would also fit if you " + "; or ".join(alternatives) + "."
    return text


# ── Facts as data ────────────────────────────────────────────────────────────────────────


def _range(messages: Sequence[Message]) -> dict[str, int] | None:
    return {"first": messages[0].number, "last": messages[-1].number} if messages else None


def _trace(step: Step) -> dict[str, Any]:
    """A step as JSON-ready data, named by its kind."""
    nested = (ChainStop, Refusal)  # the records a step holds: dataclasses, unlike the steps
    data = {key: asdict(value) if isinstance(value, nested) else value for key, value in step._asdict().items()}
    if isinstance(step, Tried):
        data["fits"] = step.fits
    return {"step": type(step).__name__, **data}


def scene_facts(scenes: Sequence[Scene], a: Assembly) -> list[dict[str, Any]]:
    """Each scene: its range, what it has, where that came from (`source`: "story" for the
    file's own scene lines, "sillytavern memory", "sidecar") and what the prompt uses of it."""
    summarized = {s.order for s in a.summaries}
    through = a.history.order if a.history else None
    return [
        {
            "id": s.ref,
            "start": s.start,
            "end": s.end,
            "title": s.title,
            "summary": bool(s.summary.strip()),
            "history": bool(s.history.strip()),
            "source": s.source or "story",
            "used": "history" if s.order == through else "summary" if s.order in summarized else None,
        }
        for s in scenes
    ]


def facts(built: Built, story_hidden: int = 0, story: Story | None = None, shown: str | None = None) -> dict[str, Any]:
    """Everything `inspect` knows, JSON-ready. Scene ids are the scene's `id`, else its order;
    `names` says who {{char}} and {{user}} are and where each name came from. Given the
    `story`, `scenes` lists all of its scenes (else those the prompt uses); `shown` is the
    story as the user named it, for the refusal's `ctx summarize` command."""
    a: Assembly = built.assembly
    names = built.names
    history = a.history
    used = {s.order: s for s in ([history] if history else []) + list(a.summaries)}
    scenes = story.scenes if story is not None else [used[order] for order in sorted(used)]
    helps = remedy(a, story, shown) if story is not None else None
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
        "tokenizer_is_the_models": built.tokenizer not in GENERIC_COUNTERS,
        "controls": {"spelled": list(built.controls), "broken_up": built.text_form} if built.controls else None,
        "names": {"char": asdict(names.char), "user": asdict(names.user)} if names else None,
        "head": _range(a.head),
        "summaries": [s.ref for s in a.summaries],
        "history": {"through_scene": history.ref} if history else None,
        "floated_cards": [m.number for m in a.floated_cards],
        "cards": [p.message.number for p in a.recap if p.kind == "card" and p.message],
        "tail": _range(a.tail),
        "tail_target": a.tail_target,
        "level": a.level,
        "sections": a.costs,
        "scenes": scene_facts(scenes, a),
        "steps": [describe(step, helps) for step in a.steps],
        "trace": [_trace(step) for step in a.steps],
    }
    data["lore"] = lore_facts(built.lore)
    if a.refusal:
        r = a.refusal
        data["refusal"] = {
            "smallest": r.smallest,
            "needed_context": r.needed_context,
            "missing_summaries": list(r.missing_summaries),
            "missing_histories": list(r.missing_histories),
            "summarize": {"first": helps.first, "last": helps.last} if helps else None,
            "message": refusal_message(r, built.budget, helps),
        }
    return data


# ── Lore ─────────────────────────────────────────────────────────────────────────────────

_NOT_FIRED = {
    "disabled": "disabled",
    "character": "its characterFilter leaves out this character",
    "no_keys": "has no keys",
    "no_match": "no key matched",
    "secondary": "its secondary keys failed ({detail})",
    "delay": "delayed ({detail})",
    "cooldown": "on cooldown ({detail})",
    "delay_until_recursion": "waits for recursion",
    "exclude_recursion": "matches only through recursion, which it excludes",
    "dont_activate": "its @@dont_activate decorator keeps it out",
    "group": "lost its group {detail!r} to entry {by}",
    "probability": "probability roll failed ({detail})",
}
_NOT_PLACED = {
    "budget": "fired but is over the lore budget; raise [lore] budget or budget_cap",
    "cap": "fired but is over the keyword engine's cap ({detail}); raise it",
    "frame": "fired but was dropped: the prompt had no room for it with the story (raise the window)",
    "empty": "fired but has no content",
    "position": "fired but its position {detail} is not one SillyTavern 1.12 places (0-6): placed nowhere",
}


def lore_reason(d: LoreDecision) -> str:
    """Why an entry fired (and where it went) or did not, in one sentence."""
    if d.reason in _NOT_PLACED:
        return _NOT_PLACED[d.reason].format(detail=d.detail)
    if not d.fired:
        return _NOT_FIRED.get(d.reason, d.reason).format(detail=d.detail, by=d.by)
    if d.reason == "key" and d.message is None:  # a key that matches any text (a blank key, a regex like /x*/)
        return f"key {d.key!r}"
    if d.reason == "key":
        who = f" by {d.speaker}" if d.speaker else ""
        return f"key {d.key!r} in message {d.message}{who}"
    if d.reason == "recursion":
        return f"key {d.key!r} in the content of entry {d.by} (recursion)"
    fired = {"constant": "constant", "sticky": "sticky from an earlier turn", "decorator": "its @@activate decorator"}
    return fired.get(d.reason, d.reason)


def lore_facts(lore: LoreChoice) -> dict[str, Any]:
    """`inspect --json`'s `lore`: the engine, the budget and every entry considered, the
    placed ones first in the order they are inserted."""

    def entry(d: LoreDecision) -> dict[str, Any]:
        e = d.entry
        return {
            "uid": e.uid,
            "source": e.source,
            "comment": e.comment,
            "character": e.character or None,
            "fired": d.fired,
            "placed": d.placed,
            "reason": d.reason,
            "why": lore_reason(d),
            "key": d.key,
            "message": d.message,
            "by": d.by,
            "position": position_name(e),
            "depth": e.depth if e.position == LorePosition.DEPTH else None,
            "role": role_name(e),
            "order": e.order,
            "tokens": d.tokens,
            "score": d.score,
        }

    return {
        "engine": lore.engine,
        "budget": lore.budget,
        "used": lore.used,
        "scanned": list(lore.scanned),
        "notes": list(lore.notes),
        "entries": [entry(d) for d in lore.decisions],
    }
