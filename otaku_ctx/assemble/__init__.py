"""The context assembler: otaku's six cases (seed 001), as docs/architecture.md states them.

Read it beside the design. The window's sections, which every case is made of:

- `head` — the opening messages, kept verbatim;
- `covered_chain` — the scenes whose summaries replace the middle, for one tail target;
- `tail` — everything after the last covered scene;
- `cards_in` — cards are never summarised: each stands before its scene's summary (the
  message-47 example);
- `recap_at_level` — case 4: a scene's history stands in for the summaries up to it, and
  the cards of those scenes float in front of it;
- `rungs` — case 5: the tail targets, 150 → 100 → 50.

Then the cases, in the seed's order, as the search tries them:

- cases 1 and 2, "all messages are placed in the context verbatim": `Search.fit_verbatim`;
- case 3, "limit context growth while maintaining the prose style": `Search.fit_summaries`;
- case 4, "let the play continue by degrading the summaries": `Search.fit_levels`;
- case 5, "let the play continue by degrading the tail": `Search.ladder`;
- case 6, "the assembler refuses to compose the context": `Search.refuse`;
- `classify` names the case of a result; it is the only place a case number is decided.

Each decision of the search is recorded as a `Step` — plain facts, no sentences; the report
layer (`report.py`) writes the sentences.

`assemble()` is pure: no I/O, no printing. What a part costs in the prompt is asked of a
`Pricer`, which knows the template and format; the assembler adds those costs up (never
re-rendering the prompt per candidate) and asks the pricer for the exact count only of the
candidate that fits, so the emitted prompt is ≤ the limit to the token.
"""

from __future__ import annotations

from dataclasses import replace

from ..story.model import Story
from .parts import CACHES, Assembly, Part, Policy, Pricer, Refusal, SceneRef, Shape, Walked
from .recall import Recall, recalled
from .search import Search
from .sections import capped_sum, cards_in, covered_chain, head, recap_at_level, rungs, tail
from .stable import Stable

__all__ = [
    "CACHES",
    "Assembly",
    "Part",
    "Policy",
    "Pricer",
    "Recall",
    "Refusal",
    "SceneRef",
    "Shape",
    "Walked",
    "assemble",
    "cards_in",
    "classify",
    "covered_chain",
    "head",
    "recap_at_level",
    "rungs",
    "tail",
]

# ── Naming the case ──────────────────────────────────────────────────────────────────────


def classify(assembly: Assembly, shape: Shape) -> int:
    """The seed's case of a result — the only place a case number is decided.

    6: refused. Nothing covered: 1 when the story holds fewer messages than the verbatim
    threshold, else 2 (whatever the tail target, since a verbatim prompt does not depend on
    it). Otherwise 5 when the tail target dropped below min_tail_messages, 4 when a history
    stands in for summaries, else 3."""
    if assembly.refusal is not None:
        return 6
    if not assembly.recap:
        return 1 if assembly.messages < shape.threshold else 2
    if assembly.tail_target < shape.min_tail:
        return 5
    return 4 if assembly.level else 3


def _verbatim_fits(story: Story, shape: Shape, limit: int, reserve: int, pricer: Pricer) -> bool:
    """Whether every message, verbatim, fits `limit` by its parts' prices (cases 1 and 2): then
    nothing is left out for recall to bring back."""
    costs = Search(story, shape, limit, reserve, pricer).verbatim_costs(story.messages, None)
    return capped_sum(costs, limit - pricer.fixed())[1]


def assemble(
    story: Story,
    shape: Shape,
    limit: int,
    pricer: Pricer,
    *,
    reserve: int = 0,
    policy: Policy = Policy(),  # noqa: B008 - frozen
    recall: Recall = Recall(),  # noqa: B008 - frozen
) -> Assembly:
    """Build the plan of the prompt for `story` within `limit` tokens (cases 1–6), choosing
    among the candidates that fit by `policy` (the exact search, or the stable one); then,
    with `recall` on, what the newest messages recall of what it left out (`recall.py`), in
    the share of the limit the cases were made to leave free (all of it when they cannot).

    Case 6 does not raise: the returned Assembly has `case == 6` and a `refusal`.
    """
    stable = policy.cache == "stable"

    def search(within: int) -> Assembly:
        search = Search(story, shape, within, reserve, pricer)
        return Stable(search, policy.slack, policy.resume, policy.hold).assemble() if stable else search.ladder()

    kept = recall.reserve(limit)
    if kept and not _verbatim_fits(story, shape, limit, reserve, pricer):
        found = search(limit - kept)
        if found.refusal is None and found.recap:
            # the newest messages of this turn ask (what is recalled stands just before the newest user
            # message, so the prefix holds whatever it is); the stable policy keeps to the share kept, so
            # the tail grows into the rest from turn to turn
            budget = kept if stable else limit - found.tokens
            found = replace(found, limit=limit)
            found = recalled(story, found, pricer, recall, limit=limit, at=len(story), budget=budget)
            return replace(found, case=classify(found, shape))
    found = search(limit)
    return replace(found, case=classify(found, shape))
