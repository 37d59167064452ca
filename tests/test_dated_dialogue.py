"""Issue 27's long dated dialogue (tests/fixtures/sillytavern/dated-dialogue.jsonl, made by
make_dated_dialogue.py beside it): 432 messages of Mira and Aldous Crane in 14 sessions, each
opening with a narrator row days after the one before. At the default `[summarize]` cutting,
`ctx summarize --dry-run` cuts its scenes on the session boundaries wherever the size bounds
allow, and the test says which ones they do not allow, and why."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

from otaku_ctx.cli.app import main
from otaku_ctx.cli.terminal import Terminal
from otaku_ctx.story.dates import apart
from otaku_ctx.story.detect import read_story
from otaku_ctx.summarize.spans import MOST, Cutting

FIXTURES = Path(__file__).parent / "fixtures" / "sillytavern"
DIALOGUE = FIXTURES / "dated-dialogue.jsonl"
DEFAULT = Cutting()  # the [summarize] defaults: 6,000 characters and 20 messages, 20 settling, 6 hours


def sessions() -> list[tuple[int, int]]:
    """The dialogue's sessions as the file marks them: (first, last) message of each, a session
    starting at each narrator row sent more than a day after the message before it."""
    messages = read_story(DIALOGUE).messages
    starts = [m.number for m in messages if m.role == "system"]
    days_later = [apart(messages[n - 2].sent, messages[n - 1].sent) for n in starts[1:]]
    assert starts[0] == 1 and all(gap is not None and gap > 86400 for gap in days_later)
    return [(a, b - 1) for a, b in zip(starts, [*starts[1:], len(messages) + 1], strict=True)]


def characters(first: int, last: int) -> int:
    return sum(len(m.content) for m in read_story(DIALOGUE).messages[first - 1 : last])


def test_the_fixture_is_what_its_script_writes() -> None:
    sys.path.insert(0, str(FIXTURES))
    try:
        import make_dated_dialogue
    finally:
        sys.path.remove(str(FIXTURES))
    assert DIALOGUE.read_text(encoding="utf-8") == make_dated_dialogue.chat()


def test_the_dialogue_is_two_people_in_fourteen_dated_sessions() -> None:
    story = read_story(DIALOGUE)
    assert len(story.messages) == 432 and len(sessions()) == 14
    assert {m.name for m in story.messages if m.role != "system"} == {"Mira", "Aldous Crane"}
    assert all(m.sent is not None for m in story.messages)
    # within a session the messages are minutes apart; the time skip of session 8 is hours
    gaps = [apart(a.sent, b.sent) for a, b in zip(story.messages, story.messages[1:], strict=False)]
    assert sorted(g for g in gaps if g is not None and g <= 86400)[-1] < DEFAULT.date_gap * 3600


def test_the_cuts_fall_on_the_sessions_where_the_size_bounds_allow() -> None:
    out = io.BytesIO()
    argv = ["summarize", str(DIALOGUE), "--url", "http://127.0.0.1:9/v1", "--model", "m", "--dry-run", "--json"]
    assert main(argv, Terminal(stdin=io.BytesIO(), stdout=out, stderr=io.StringIO())) == 0
    plan = json.loads(out.getvalue())
    scenes = [(r["start"], r["end"], r["cut"]) for r in plan["requests"] if r["kind"] == "summary"]
    by_start = {a: (b, why) for a, b, why in scenes}
    s = sessions()
    starts = [a for a, _ in s]

    # Session 4 (messages 81-88) is a short late-night exchange, below the minimum: it cannot
    # stand alone, and runs on into session 5, which is cut where session 6 begins.
    four, five = s[3], s[4]
    assert four[1] - four[0] + 1 < DEFAULT.min_messages and characters(*four) < DEFAULT.min_chars
    assert by_start[four[0]][0] == five[1] and five[0] not in by_start

    # Session 8 (a day in Amsterdam) holds more than twice the minimum: it is cut inside, before
    # "Later that night", the first break it marks once the minimum is reached.
    eight = s[7]
    assert characters(*eight) > MOST * DEFAULT.min_chars
    inside_eight = [a for a in by_start if eight[0] < a <= eight[1]]
    assert len(inside_eight) == 1 and by_start[eight[0]][1] == "a time skip ('Later that night')"
    assert read_story(DIALOGUE).message(inside_eight[0]).content.startswith("Later that night")

    # Session 11 (Ola Nes's letter) holds more than twice the minimum and marks nothing inside:
    # cut once by size, where the minimum is reached; its rest ends where session 12 begins.
    eleven = s[10]
    assert characters(*eleven) > MOST * DEFAULT.min_chars
    first_end, why = by_start[eleven[0]]
    assert why == "size" and first_end < eleven[1]
    assert first_end - eleven[0] + 1 == DEFAULT.min_messages or characters(eleven[0], first_end - 1) < DEFAULT.min_chars
    assert by_start[first_end + 1][0] == eleven[1]

    # Session 14, the newest: its last 20 messages settle; the rest of it is one scene.
    fourteen = s[13]
    assert by_start[fourteen[0]] == (432 - DEFAULT.settle, f"the newest {DEFAULT.settle} messages settle first")

    # Every other session boundary is a cut, for the reasons the story marks there.
    cut_before = {end + 1 for _, end, _ in scenes[:-1]}
    assert cut_before == (set(starts[1:]) - {five[0]}) | set(inside_eight) | {first_end + 1}
    for _, end, why in scenes[:-1]:
        if end + 1 in starts:
            assert why.startswith("a narrator row and a gap of ") and why.endswith(" in send_date"), why
    # and the scenes cover the settled messages, one after another
    assert scenes[0][0] == 1 and all(a[1] + 1 == b[0] for a, b in zip(scenes, scenes[1:], strict=False))


def test_without_its_dates_and_narrator_rows_the_dialogue_is_cut_by_size(tmp_path: Path) -> None:
    """The same chat with every send_date unreadable and the narrator rows turned into Mira's:
    nothing marks a session, and the cuts fall by size, most of them inside sessions."""
    rows = [json.loads(line) for line in DIALOGUE.read_text(encoding="utf-8").splitlines()]
    for row in rows[1:]:
        row["send_date"] = "sometime"
        if row["extra"].get("type") == "narrator":
            row.update(name="Mira", is_user=True, extra={})
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = io.BytesIO()
    argv = ["summarize", str(plain), "--url", "http://127.0.0.1:9/v1", "--model", "m", "--dry-run", "--json"]
    assert main(argv, Terminal(stdin=io.BytesIO(), stdout=out, stderr=io.StringIO())) == 0
    cuts = [r["cut"] for r in json.loads(out.getvalue())["requests"] if r["kind"] == "summary"]
    assert set(cuts[:-1]) <= {"size", "a time skip ('Later that night')"} and cuts.count("size") >= 10
