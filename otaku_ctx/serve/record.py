"""The recording stage of a chat turn: what serve says of it — the one log line a turn, the
shape a small window made a chat take (once), the refusal of a chat that cannot fit — and what
`/ctx/stats` shows. Counts and settings only, never a chat's text."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..assemble import Assembly
from ..assemble.steps import Recalled
from .assemble import Assembled
from .chats import Said
from .errors import DoesNotFit
from .session import Session
from .sessions import Sessions
from .stats import Turn, Usage

if TYPE_CHECKING:
    from .setup import Setup

log = logging.getLogger("otaku_ctx.serve")
#: a line that is written every time, however many like it came (`logs.Hush` passes it): one a turn
EVERY = {"every": True}


def say_shape(session: Session, assembled: Assembled, setup: Setup) -> None:
    """Once a chat, when the backend's window made serve shape it otherwise than configured."""
    if assembled.messages is None or (not assembled.rung and assembled.truncated is None):
        return
    c, given = setup.rungs[min(assembled.rung, len(setup.rungs) - 2)].context, setup.settings.context
    if assembled.truncated is not None and assembled.sofar:
        said = (
            f"the window holds no head of {c.head_messages} and tail of {c.tail_floor} beside the frame: the story"
            " so far and the newest messages that fit are sent"
        )
    elif assembled.truncated is not None:
        a = assembled.built.assembly
        room = a.limit - a.costs.get("fixed", 0)
        said = (
            f"the window holds no head of {c.head_messages} and tail of {c.tail_floor} beside the frame, nor the"
            f" story so far beside the newest message (the frame leaves {room:,} of the limit's {a.limit:,} tokens):"
            " the newest messages that fit are sent alone; a larger window or a shorter card keeps the story"
        )
    else:
        said = (
            f"head {c.head_messages} and tail floor {c.tail_floor} (the settings' {given.head_messages} and"
            f" {given.tail_floor} do not fit the window beside the frame)"
        )
    if session.turn.say(said):
        log.info("chat %s: %s", session.key[:12], said)


def say_trimmed(session: Session, dialogue: Sequence[Said]) -> None:
    """Once a chat, when the frontend itself left out the chat's start (a request that begins
    inside the chat as last seen), and which of its settings sends the whole chat."""
    if session.trims == 1 and session.trimmed:
        log.warning(
            "chat %s: the frontend sent only the newest %d of the chat's %d messages, leaving out its start"
            " (it trims to its own context setting): ctx keeps the opening and summaries only of what it is"
            " sent; raise the frontend's context above the backend's window (SillyTavern: unlock Context Size;"
            " Agnai: Max Context)",
            session.key[:12], len(dialogue), len(session.dialogue),
        )  # fmt: skip


def refusal(session: Session | None, assembled: Assembled) -> DoesNotFit:
    """Case 6, which is now only a chat whose frame and newest message cannot fit: the error naming
    the window it needs (and why the summaries could not help, when they could not be written)."""
    refused = assembled.built.assembly.refusal
    assert refused is not None
    key = session.key[:12] if session is not None else "(probe)"
    log.info("chat %s · %d messages · case 6 · refused (needs %d)", key, assembled.held, refused.needed_context,
             extra=EVERY)  # fmt: skip
    remedy = "start the backend with a larger context, or send a shorter system prompt and card"
    why = session.summaries.why if session is not None else ""
    if why:
        remedy += f" (the summaries could not be written: {why})"
    return DoesNotFit(
        f"this chat does not fit: its frame and newest message alone are {refused.smallest:,} tokens,"
        f" the limit {refused.limit:,} (a {refused.context:,}-token window less {refused.reserve:,} for the reply);"
        f" it needs a window of {refused.needed_context:,} tokens: {remedy}"
    )


def record(session: Session | None, assembled: Assembled, usage: Usage, seconds: float, cancelled: bool) -> None:
    """A turn's end: kept in its chat's stats, and its one log line."""
    a = assembled.built.assembly
    step = recall_step(a)
    engine, why = (step.engine, step.why) if step is not None else ("", "")
    turn = Turn(assembled.held, a.case, a.tokens, a.limit, usage.prompt_tokens, usage.cached, round(seconds, 4),
                cancelled, recalled_of(a), assembled.sent, engine, why)  # fmt: skip
    cached = f"{turn.cached:,} cached" if turn.cached is not None else "cache not reported"
    stopped = " · stopped by the client" if cancelled else ""
    if session is None:
        log.info("a one-message probe · %s tokens sent · %s%s", f"{a.tokens:,}", cached, stopped, extra=EVERY)
        return
    number = session.stats.add(turn)
    by = " by meaning" if turn.recall_engine == "meaning" else ""
    recalled = f" · recalled{by} {', '.join(turn.recalled)}" if turn.recalled else ""
    log.info(
        "chat %s · turn %d · %s messages, %s sent · case %d · %s tokens sent (limit %s) · %s · ctx %.3f s%s%s",
        session.key[:12], number, f"{turn.messages:,}", f"{turn.messages_sent:,}", a.case, f"{a.tokens:,}",
        f"{a.limit:,}", cached, seconds, recalled, stopped, extra=EVERY,
    )  # fmt: skip


def recall_step(a: Assembly) -> Recalled | None:
    """The turn's recall, as its last `Recalled` step says it (None: nothing was recalled)."""
    return next((s for s in reversed(a.steps) if isinstance(s, Recalled)), None)


def recalled_of(a: Assembly) -> tuple[str, ...]:
    """What the turn's newest messages recalled, by number ("message 38", "scene 9"), best first
    (`inspect --explain` says why each was: `report.py`)."""
    step = recall_step(a)
    if step is None:
        return ()
    return tuple(f"{kind} {ref:,}" if isinstance(ref, int) else f"{kind} {ref}" for kind, ref, *_ in step.taken)


def stats_of(sessions: Sessions) -> dict[str, Any]:
    """`GET /ctx/stats`: each chat that has had a turn, its case, its summaries, its turns; and
    the requests served as one-shots (no chat's: `sessions`), and how many are held."""
    chats = []
    for session in sessions:
        turns = session.stats.all()
        if not turns:
            continue
        chats.append(
            {
                "chat": session.key,
                "named": session.chat.named,
                "case": turns[-1].case,
                "summaries_writing": session.summaries.writing,
                "summaries_left": session.summaries.left,
                "summaries_failed": session.summaries.why,
                "summaries": {
                    "by_model": session.summaries.by_model,
                    "extracts": session.summaries.extracts,
                    "turned_down": session.summaries.turned_down,
                    "too_slow": session.summaries.too_slow,
                },
                "shape": session.turn.said or "as configured",
                "turns": [t.facts() for t in turns],
            }
        )
    return {"chats": chats, "one_shots": {"served": sessions.one_shots_served, "held": sessions.held}}
