"""When a message was sent, read from the `send_date` of a SillyTavern row, whatever version
wrote it: each form is read once, when the chat is read, and one that is none of them (or no
real date) is no date at all, never an error — a chat is read for its text, and a date is only
a hint of where its sessions begin (`summarize/spans.py`).

The forms SillyTavern and TavernAI have written:

- a number, or a text of digits: milliseconds since 1970 (`Date.now()`), UTC;
- ISO 8601, `2025-03-04T19:05:00.000Z` (`toISOString()`, since 1.12), UTC or its own offset;
- `March 4, 2025 7:05pm` (the older `getMessageTimeStamp`), the writer's local time;
- `2025-03-04@19h05m00s` with or without `123ms`, and `2025-3-4 @19h 05m 00s 123ms`
  (`humanizedDateTime`), the writer's local time.

A date with a zone (the first two) is kept aware of it; a local one is kept naive, since the
zone it was written in is not in the file. `apart` compares two dates only when both are of
one kind: between a local date and a UTC one the zone is unknown, and hours of it would read
as a gap.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

MONTHS = {
    name: number
    for number, names in enumerate(
        (
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ),
        start=1,
    )
    for name in names
}
_DIGITS = re.compile(r"\d{1,16}")
_ISO = re.compile(r"\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?(Z|[+-]\d{2}:?\d{2})?", re.IGNORECASE)
_MERIDIEM = re.compile(r"([a-z]+)\.? +(\d{1,2}), *(\d{4}),? +(\d{1,2}):(\d{2}) *([ap])\.?m\.?", re.IGNORECASE)
_HUMANIZED = re.compile(r"(\d{4})-(\d{1,2})-(\d{1,2}) *@(\d{1,2})h *(\d{1,2})m *(\d{1,2})s(?: *(\d{1,3})ms)?")


def sent_at(value: object) -> datetime | None:
    """The date a `send_date` says, or None when it says none that can be read."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return _epoch_ms(value)
    if not isinstance(value, str):
        return None
    text = value.strip()
    if len(text) > 64:  # no form is longer; a long text is not a date
        return None
    try:
        if _DIGITS.fullmatch(text):
            return _epoch_ms(int(text))
        if _ISO.fullmatch(text):
            return datetime.fromisoformat(text.replace("z", "Z"))
        if found := _MERIDIEM.fullmatch(text):
            return _meridiem(*found.groups())
        if found := _HUMANIZED.fullmatch(text):
            year, month, day, hour, minute, second, ms = found.groups()
            return datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), int(ms or 0) * 1000)
    except ValueError:  # a form, but no real date (February 30, hour 25)
        return None
    return None


def _epoch_ms(ms: float) -> datetime | None:
    if not math.isfinite(ms) or ms < 0:
        return None
    try:
        return datetime.fromtimestamp(ms / 1000, UTC)
    except (OverflowError, OSError, ValueError):  # past the year 9999
        return None


def _meridiem(month: str, day: str, year: str, hour: str, minute: str, half: str) -> datetime | None:
    number = MONTHS.get(month.lower())
    if number is None or not 1 <= int(hour) <= 12:
        return None
    hours = int(hour) % 12 + (12 if half.lower() == "p" else 0)
    return datetime(int(year), number, int(day), hours, int(minute))


def apart(earlier: datetime | None, later: datetime | None) -> float | None:
    """Seconds from `earlier` to `later` (negative when the clock went back), or None when
    either has no date or one is local and the other not (the zone between them is unknown)."""
    if earlier is None or later is None or (earlier.tzinfo is None) != (later.tzinfo is None):
        return None
    return (later - earlier).total_seconds()
