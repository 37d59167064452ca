"""A SillyTavern row's `send_date`, in each form SillyTavern and TavernAI have written, is its
message's `sent`, read once by the reader (story/dates.py); a form that cannot be read is no
date, never an error."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from otaku_ctx.story.dates import apart, sent_at
from otaku_ctx.story.sillytavern import read_sillytavern

LOCAL = datetime(2025, 3, 4, 19, 5)  # a writer's local time: no zone in the file


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1741115100000, datetime(2025, 3, 4, 19, 5, tzinfo=UTC)),  # Date.now(): milliseconds, UTC
        ("1741115100000", datetime(2025, 3, 4, 19, 5, tzinfo=UTC)),  # the same as text
        (1741115100000.0, datetime(2025, 3, 4, 19, 5, tzinfo=UTC)),
        ("2025-03-04T19:05:00.000Z", datetime(2025, 3, 4, 19, 5, tzinfo=UTC)),  # toISOString()
        ("2025-03-04T21:05:00+02:00", datetime(2025, 3, 4, 19, 5, tzinfo=UTC)),  # an offset of its own
        ("March 4, 2025 7:05pm", LOCAL),  # the older getMessageTimeStamp
        ("March 4, 2025 7:05 PM", LOCAL),
        ("Mar 4, 2025 7:05pm", LOCAL),
        ("March 4, 2025 12:30am", datetime(2025, 3, 4, 0, 30)),  # 12 am is midnight
        ("March 4, 2025 12:30pm", datetime(2025, 3, 4, 12, 30)),  # 12 pm is noon
        ("2025-03-04@19h05m00s", LOCAL),  # humanizedDateTime
        ("2025-3-4@19h5m0s123ms", LOCAL.replace(microsecond=123_000)),
        ("2025-3-4 @19h 05m 00s 123ms", LOCAL.replace(microsecond=123_000)),
    ],
)
def test_each_form_sillytavern_has_written_is_read(value: object, expected: datetime) -> None:
    assert sent_at(value) == expected
    assert (sent_at(value).tzinfo is None) == (expected.tzinfo is None)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "value",
    [
        None, "", "   ", "x", "yesterday", True, -5, float("nan"), float("inf"), 10**20, [], {},
        "February 30, 2025 7:05pm",  # the form, but no such day
        "March 4, 2025 13:05pm",  # no 13 o'clock in a 12-hour clock
        "Smarch 4, 2025 7:05pm",  # no such month
        "2025-13-04T19:05:00Z",
        "9" * 16,  # milliseconds past the year 9999
        "March 4, 2025 7:05pm" * 10,  # far longer than any form
    ],
)  # fmt: skip
def test_what_is_no_date_is_none_never_an_error(value: object) -> None:
    assert sent_at(value) is None


def test_gaps_are_measured_only_between_dates_of_one_kind() -> None:
    utc, local = datetime(2025, 3, 4, 19, 5, tzinfo=UTC), datetime(2025, 3, 4, 19, 5)
    assert apart(utc, utc + timedelta(days=3)) == 3 * 86400
    assert apart(local, local - timedelta(hours=1)) == -3600  # a clock set back: negative, the caller's to read
    assert apart(utc, utc.astimezone(timezone(timedelta(hours=5)))) == 0  # one instant in two zones
    assert apart(local, utc + timedelta(days=3)) is None  # local then UTC: the zone between is unknown
    assert apart(None, utc) is None and apart(utc, None) is None


def test_the_reader_keeps_each_rows_date_and_a_bad_one_is_no_date(tmp_path: Path) -> None:
    rows = [
        {"user_name": "Mara", "character_name": "Keeper", "create_date": "2025-03-04@19h05m00s", "chat_metadata": {}},
        {"name": "Mara", "is_user": True, "send_date": "March 4, 2025 7:05pm", "mes": "The lamp is out."},
        {"name": "Keeper", "is_user": False, "send_date": "not a date", "mes": "I will light it."},
        {"name": "Mara", "is_user": True, "send_date": "x", "is_system": True, "mes": "hidden"},
        {"name": "Keeper", "is_user": False, "mes": "No date at all."},
        {"name": "", "is_user": False, "send_date": 1741460700000, "extra": {"type": "narrator"}, "mes": "Day 2."},
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    story = read_sillytavern(path)
    assert [m.sent for m in story.messages] == [
        LOCAL,
        None,
        None,
        datetime(2025, 3, 8, 19, 5, tzinfo=UTC),
    ]
    assert story.messages[3].role == "system"


def test_a_date_is_not_what_was_said_so_messages_alike_but_for_it_are_equal() -> None:
    from otaku_ctx.story.model import Message

    assert Message(1, "user", "Hi", "Mara", sent=LOCAL) == Message(1, "user", "Hi", "Mara")


def test_ctx_convert_keeps_the_dates_so_a_converted_chat_is_cut_where_it_was(tmp_path: Path) -> None:
    """The native format's `sent`: each message's date as ctx read it, aware or local, so the
    dated dialogue converted to native JSONL reads back with every date, and `ctx summarize
    --dry-run` cuts it where it cut the chat, for the same reasons (before, the native file kept
    no date, and its cuts fell by size alone)."""
    from io import BytesIO, StringIO

    from otaku_ctx.cli.app import main
    from otaku_ctx.cli.terminal import Terminal
    from otaku_ctx.story.detect import read_story

    def ctx(*argv: str) -> str:
        out = BytesIO()
        assert main(list(argv), Terminal(stdin=BytesIO(), stdout=out, stderr=StringIO())) == 0
        return out.getvalue().decode()

    dialogue = Path(__file__).parent / "fixtures" / "sillytavern" / "dated-dialogue.jsonl"
    header, opening, *rows = dialogue.read_bytes().splitlines()
    assert json.loads(opening)["extra"]["type"] == "narrator"  # native has no numbered system message first
    chat = tmp_path / "chat.jsonl"
    chat.write_bytes(b"\n".join([header, *rows]) + b"\n")
    native = tmp_path / "dialogue.jsonl"
    ctx("convert", str(chat), "-o", str(native))
    dates = [m.sent for m in read_story(chat).messages]
    assert sum(d is not None for d in dates) > 100 and [m.sent for m in read_story(native).messages] == dates
    cuts = ctx("summarize", str(chat), "--dry-run", "--window", "8192").replace(str(chat), "STORY")
    assert "send_date" in cuts
    assert ctx("summarize", str(native), "--dry-run", "--window", "8192").replace(str(native), "STORY") == cuts
