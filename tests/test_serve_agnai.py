"""What Agnai 1.0.27 really sent to `ctx serve` (tests/fixtures/agnai-requests/, captured on the
wire), sent again in order through serve to the stand-in backend of test_serve, each body's JSON
as captured to the path it was posted to: every request answered, `/ctx/stats` showing one chat
for each chat of the session, and no request's prompt holding another chat's messages.

What the session is, request by request (its README, its `what_the_user_did`, and the bodies
themselves; `test_the_session_is_what_its_readme_says` holds each point):

- three chats, by their dialogue: the short chat (requests 1–11, then 23–25), the 300-message
  chat imported (12–22, then 27–44), and what Agnai sent of the short chat after it lost its
  history (26, then 45–49). That last one begins with the short chat's last reply and shares no
  message with it, so it is a chat of its own: ctx cannot know what Agnai lost.
- every request ends with Agnai's prefill, an assistant message "Mira:", but "Generate More"
  (41), which ends with the reply to go on with and a system message "Continue Mira's response";
- Regenerate: 7 and 37, each the request before it again;
- the persona renamed, every past message rewritten: "You" -> "Tomas" at 3, "Tomas" -> "Tom" at
  28 (and at 45, in the third chat);
- an edit of a message twelve from the end at 27; a message in the middle deleted at 48 and 49;
- Agnai's own trimming at 42–44 (Max Context left at 2,048): each starts later in the chat;
- Local Requests: 23 posts to `/chat/completions` with no `/v1`, 25 to `/v1/chat/completions`,
  both with the body field `prompt` and no `Authorization`; 24 is 23 again through Agnai's server.

The backend's window here is 4,096: the captured 2,048 leaves request 31, which asks for a
2,000-token reply, no room (serve refuses it, as it did in the session), and at 4,096 the
300-message chat is still assembled from the head, summaries and tail.
"""

from __future__ import annotations

import gzip
import http.client
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_serve import StandIn, _get, settings_for

from otaku_ctx.config import Settings
from otaku_ctx.serve.http import Service
from otaku_ctx.serve.listen import Running

SESSION = Path(__file__).resolve().parent / "fixtures" / "agnai-requests" / "agnai-session.jsonl.gz"
WINDOW = 4096

#: the session's chats, by the numbers of their requests
SHORT = (*range(1, 12), 23, 24, 25)
IMPORTED = (*range(12, 23), *range(27, 45))
REMNANT = (26, *range(45, 50))


def captured() -> list[dict[str, Any]]:
    with gzip.open(SESSION, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def dialogue(body: dict[str, Any]) -> list[str]:
    """The user and assistant messages' texts."""
    return [m["content"] for m in body["messages"] if m["role"] in ("user", "assistant")]


def renamed(texts: list[str], old: str, new: str) -> list[str]:
    """`texts` with the persona's name, at the start of each of its messages, renamed."""
    return [new + t.removeprefix(old) if t.startswith(f"{old}: ") else t for t in texts]


@dataclass(frozen=True)
class Replayed:
    """Serve's status for each request (by its number), the body serve sent on for it, and
    `/ctx/stats` at the end."""

    statuses: dict[int, int]
    forwarded: dict[int, dict[str, Any]]
    stats: dict[str, Any]


def live(stand_in: StandIn) -> list[dict[str, Any]]:
    """The turns serve forwarded (Agnai's own `presence_penalty` rides along), not its summaries."""
    return [b for b in stand_in.bodies if "presence_penalty" in b]


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Replayed:
    """The session played once for the module's tests, with summaries written as it goes."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OTAKU_HOME", str(tmp_path_factory.mktemp("otaku-home")))
        stand_in = StandIn().start()
        stand_in.window = WINDOW
        running = Running(Service(Settings(serve=settings_for(stand_in.url, summarize=True).serve)))
        host, port = running.url.split("//")[1].split("/")[0].split(":")
        statuses, forwarded = {}, {}
        try:
            for each in captured():
                before = len(live(stand_in))
                headers = {"Content-Type": "application/json", **each["headers"]}
                if each["authorization"] is not None:
                    headers["Authorization"] = each["authorization"]
                connection = http.client.HTTPConnection(host, int(port), timeout=60)
                connection.request("POST", each["path"], json.dumps(each["body"]).encode(), headers)
                answer = connection.getresponse()
                answer.read()
                connection.close()
                statuses[each["turn"]] = answer.status
                sent = live(stand_in)[before:]
                assert len(sent) <= 1, each["turn"]
                if sent:
                    forwarded[each["turn"]] = sent[0]
            stats = json.loads(_get(running, "/ctx/stats"))
        finally:
            running.stop()
            stand_in.stop()
    return Replayed(statuses, forwarded, stats)


# ── what the session is ────────────────────────────────────────────────────────────────────


def test_the_session_is_what_its_readme_says() -> None:
    requests = {each["turn"]: each for each in captured()}
    assert sorted(requests) == list(range(1, 50)) == sorted((*SHORT, *IMPORTED, *REMNANT))
    bodies = {n: each["body"] for n, each in requests.items()}
    said = {n: dialogue(body) for n, body in bodies.items()}
    # each chat's requests go on from the one before: each holds all but the last of its
    # predecessor's dialogue, but for the renames, the edit, the deletes and Agnai's trimming
    firsts = {said[n][0] for n in SHORT}, {said[n][0] for n in (*range(12, 23), *range(27, 42))}
    assert len(firsts[0]) == len(firsts[1]) == 1 and firsts[0] != firsts[1]
    assert said[26][0] not in said[25] and said[26][0].startswith("Mira: (standin reply #112")
    assert not set(said[26]) & set(said[25]) - {"Mira:"}  # the remnant shares no message with its chat
    # the prefill, and "Generate More"
    assert all(bodies[n]["messages"][-1] == {"role": "assistant", "content": "Mira:"} for n in bodies if n != 41)
    assert bodies[41]["messages"][-1] == {"role": "system", "content": "Continue Mira's response"}
    assert said[42][-3].startswith(said[41][-1]) and len(said[42][-3]) > len(said[41][-1])
    # Regenerate
    assert bodies[7] == bodies[6] and bodies[37] == bodies[36]
    # the renames: every past message of the persona's rewritten, and `stop`
    assert renamed(said[2][:-1], "You", "Tomas") == said[3][: len(said[2]) - 1] != said[2][:-1]
    assert renamed(said[27][:-1], "Tomas", "Tom") == said[28][: len(said[27]) - 1] != said[27][:-1]
    assert renamed(said[26][:-1], "Tomas", "Tom") == said[45][: len(said[26]) - 1] != said[26][:-1]
    assert [bodies[n]["stop"] for n in (2, 3, 27, 28)] == [["\nYou:"], ["\nTomas:"], ["\nTomas:"], ["\nTom:"]]
    # the edit, twelve from the end of 27; the deletes in the middle of 48 and 49
    assert said[22][-10] == "Tomas: I draw my knife and wait."
    assert said[27][-12] == "Tomas: I draw my knife, heart pounding, and wait in silence."
    assert len(said[48]) == len(said[47]) + 1 and "Tom: Non-streamed: does the reply arrive whole?" not in said[48]
    assert len(said[49]) == len(said[48]) + 1 and "Tom: Testing without a key." not in said[49]
    # Agnai's own trimming: 44, 38, 30 messages of a chat of hundreds, each starting later
    assert [len(bodies[n]["messages"]) for n in (41, 42, 43, 44)] == [349, 44, 38, 30]
    assert said[42][0] != said[43][0] != said[44][0] and said[44][0] in said[41]
    # Local Requests
    assert [requests[n]["path"] for n in (23, 24, 25)] == ["/chat/completions", *["/v1/chat/completions"] * 2]
    assert [("prompt" in bodies[n], requests[n]["authorization"]) for n in (23, 24, 25)] == [
        (True, None),
        (False, "Bearer null"),
        (True, None),
    ]
    assert bodies[24]["messages"] == bodies[23]["messages"]


# ── what serve does with it ────────────────────────────────────────────────────────────────


def test_every_request_is_answered(replayed: Replayed) -> None:
    refused = {n: status for n, status in replayed.statuses.items() if status != 200}
    assert not refused


def test_every_answered_request_is_sent_on_with_no_other_chat_s_text(replayed: Replayed) -> None:
    """Each prompt's user and assistant messages are the request's own: no message of another
    chat of the session (the three share their character, and so their frame)."""
    requests = {each["turn"]: each["body"] for each in captured()}
    assert set(replayed.forwarded) == {n for n, status in replayed.statuses.items() if status == 200}
    for n, sent in replayed.forwarded.items():
        own = set(dialogue(requests[n]))
        assert [text[:60] for text in dialogue(sent) if text not in own] == [], n


def test_what_ctx_writes_names_the_speakers_as_agnai_does(replayed: Replayed) -> None:
    """Agnai writes the names into the content ("Mira: …"), and sends no `name`: what ctx writes
    itself (the story so far, a scene's extract, a recalled message's heading) names them so,
    never "Character:" or "User:", nor a name doubled ("Mira: Mira:") (issue 43)."""
    seen = {m["content"] for each in captured() for m in each["body"]["messages"]}
    written = [
        m["content"] for sent in replayed.forwarded.values() for m in sent["messages"] if m["content"] not in seen
    ]
    told = [w for w in written if "[Story so far" in w]
    assert told and any("Mira: " in w for w in told)
    for text in written:
        assert "Character:" not in text and "User:" not in text and "Mira: Mira:" not in text, text[:200]


def test_every_field_but_the_messages_goes_on_as_agnai_sent_it(replayed: Replayed) -> None:
    """`stop`, the penalties, `prompt` of Local Requests, ..., and the prefill last."""
    requests = {each["turn"]: each["body"] for each in captured()}
    for n, sent in replayed.forwarded.items():
        asked = requests[n]
        assert {k: v for k, v in sent.items() if k != "messages"} == {k: v for k, v in asked.items() if k != "messages"}
        assert sent["messages"][-1] == asked["messages"][-1], n


def test_the_stats_show_one_chat_for_each_chat_of_the_session(replayed: Replayed) -> None:
    """The renames (the persona's name written into every past message), the edit, the deletes
    (one of them in the remnant's opening), Regenerate, "Generate More" and Agnai's own trimming
    each stay their chat (before: 5 chats for 3)."""
    chats = replayed.stats["chats"]
    turns = sorted(len(chat["turns"]) for chat in chats)
    assert turns == sorted(map(len, (SHORT, IMPORTED, REMNANT))), [
        (chat["chat"], [t["messages"] for t in chat["turns"]]) for chat in chats
    ]
