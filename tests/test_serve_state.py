"""serve's shape, held by tests: its modules stay small, a chat's state is written only by the
part that owns it (each naming its lock), and a refused request leaves no trace — neither in
the registry of chats nor in any summaries file — whatever is malformed in it. The stages are
called as plain code; the HTTP layer through aiohttp's own test client."""

from __future__ import annotations

import ast
import asyncio
import copy
import functools
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from test_serve import StandIn, chat, settings_for

from otaku_ctx.config import Settings
from otaku_ctx.serve import session as state
from otaku_ctx.serve.chats import ChatError
from otaku_ctx.serve.http import Service
from otaku_ctx.serve.request import parse
from otaku_ctx.serve.sessions import Sessions

SERVE = Path(state.__file__).parent
MODULES = sorted(SERVE.glob("*.py"))
#: the parts of a chat's state, each the one writer of its fields
PARTS = (state.Session, state.TurnState, state.SidecarState, state.SummaryState, state.Turns)
#: what changes a list, dict, set or deque in place
MUTATORS = {"append", "appendleft", "extend", "insert", "pop", "popitem", "popleft", "clear", "update", "remove",
            "add", "discard", "setdefault", "move_to_end", "sort", "reverse"}  # fmt: skip


@functools.cache
def tree_of(path: Path) -> ast.Module:
    """A module of serve, parsed once for all the checks below (the tree is only read)."""
    return ast.parse(path.read_text(encoding="utf-8"))


def test_every_module_of_serve_is_short_and_no_class_does_too_much() -> None:
    for path in MODULES:
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines < 350, f"serve/{path.name} is {lines} lines"
        for node in ast.walk(tree_of(path)):
            if isinstance(node, ast.ClassDef):
                methods = [n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
                assert len(methods) <= 12, f"serve/{path.name}: {node.name} has {len(methods)} methods"


def fields(part: type) -> set[str]:
    """The attributes a part keeps: its dataclass fields, and what its methods assign on `self`."""
    found = set(getattr(part, "__dataclass_fields__", {}))
    for node in ast.walk(ast.parse(inspect.getsource(part))):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                found.add(node.attr)
    return found


#: the fields that hold a part: a call of theirs is that part's own method
HOLDERS = {name for name, f in state.Session.__dataclass_fields__.items() if f.default_factory in PARTS}


def writes(tree: ast.AST) -> list[tuple[str, int, bool]]:
    """Each attribute this code writes — assigned, deleted, an item of it set, or changed in place
    by a call (but a part's own methods) — as (attribute, line, whether it is reached through a
    session's part: `session.turn.rung`)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
            through = isinstance(node.value, ast.Attribute) and node.value.attr in HOLDERS
            found.append((node.attr, node.lineno, through))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store | ast.Del):
            if isinstance(node.value, ast.Attribute):
                found.append((node.value.attr, node.lineno, False))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            if isinstance(node.func.value, ast.Attribute) and node.func.value.attr not in HOLDERS:
                found.append((node.func.value.attr, node.lineno, False))
    return found


def owned_writes_outside_their_owner() -> list[str]:
    owners = {name: part for part in PARTS for name in fields(part)}
    free = {part: _ambiguous_free(part) for part in PARTS}
    found = []
    for path in MODULES:
        tree = tree_of(path)
        inside: dict[int, str] = {}  # a line of a part's own body -> the part's name
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name in {p.__name__ for p in PARTS}:
                for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                    inside[line] = node.name
        for name, line, through in writes(tree):
            owner = owners.get(name)
            mine = owner is not None and (through or name in free[owner])
            if owner is not None and mine and inside.get(line) != owner.__name__:
                found.append(f"serve/{path.name}:{line} writes {owner.__name__}.{name}")
    return found


def _ambiguous_free(part: type) -> set[str]:
    """A part's fields that no other class of serve also has (a `lock` or `story` of another
    class is that class's own)."""
    others: set[str] = set()
    for path in MODULES:
        for node in ast.walk(tree_of(path)):
            if isinstance(node, ast.ClassDef) and node.name != part.__name__:
                for item in ast.walk(node):
                    if isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store):
                        if isinstance(item.value, ast.Name) and item.value.id == "self":
                            others.add(item.attr)
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        others.add(item.target.id)
    return fields(part) - others


def test_a_chats_state_is_written_only_by_the_part_that_owns_it() -> None:
    assert all(_ambiguous_free(part) for part in PARTS), "each part has fields of its own to guard"
    assert HOLDERS == {"turn", "sidecar", "summaries", "stats"}
    assert not owned_writes_outside_their_owner()


def test_the_ownership_check_finds_a_write_from_outside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: a module that sets a turn's rung itself is found."""
    stray = tmp_path / "stray.py"
    stray.write_text(
        "def f(session, state):\n    session.turn.rung = 3\n    session.summaries.wanted = None\n"
        "    state.walk = None\n    session.stats._turns.clear()\n"
    )
    monkeypatch.setattr(__import__(__name__), "MODULES", [*MODULES, stray])
    assert owned_writes_outside_their_owner() == [
        "serve/stray.py:2 writes TurnState.rung",
        "serve/stray.py:3 writes SummaryState.wanted",
        "serve/stray.py:4 writes TurnState.walk",
        "serve/stray.py:5 writes Turns._turns",
    ]


def test_each_part_names_its_lock() -> None:
    for part in (*PARTS, Sessions):
        assert "Lock: `" in (part.__doc__ or ""), f"{part.__name__} does not say which lock guards it"


# -- a refused request leaves no trace -----------------------------------------------------------

#: each a request that must be refused, and what of it is wrong; each is the chat below, played
#: on, edited (which forks a branch) or named (which renames a chat) where it is not malformed
BRANCH = [*chat(52)[:31], {"role": "user", "content": "Another way."}]


def malformed() -> dict[str, dict[str, Any]]:
    def body(messages: list[Any], **more: Any) -> dict[str, Any]:
        return {"model": "m", "messages": messages, **more}

    return {
        "a tool message fourth": body([*chat(3), {"role": "tool", "content": "x", "tool_call_id": "1"}, *chat(54)[4:]]),
        "a branch with a tool message last": body([*BRANCH, {"role": "tool", "content": "x"}]),
        "the chat played on, a number as content": body([*chat(54)[:-1], {"role": "user", "content": 7}]),
        "a name that is no text": body([*chat(54)[:-1], {"role": "user", "content": "Hi", "name": ["x"]}]),
        "an image part": body([*chat(53), {"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        "a message that is no object": body([*chat(53), "Hi"]),
        "only system messages": body([{"role": "system", "content": "Be brief."}]),
        "a reserve below zero": body(chat(54), max_tokens=-1),
        "named, and a tool message": body([*chat(53), {"role": "function", "content": "x"}], user="another"),
        "a field nested past the bound": body(chat(54), tools=nested(120)),
    }


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("how", sorted(malformed()))
def test_parse_refuses_each_malformed_request(how: str) -> None:
    with pytest.raises(ChatError):
        parse(malformed()[how], {}, settings_for("http://127.0.0.1:9").serve)


def registry(service: Service) -> list[tuple[Any, ...]]:
    """What the registry holds, in its order: each session, its identity and what its turns kept;
    and the one-shots served and held."""
    return [
        (s, s.key, s.pool, list(s.dialogue), s.trimmed, s.turn.sent, s.turn.rung, s.turn.cut,
         copy.deepcopy(s.turn.frame), len(s.stats.all()), s.sidecar.own_pool)
        for s in service.sessions
    ] + [(service.sessions.one_shots_served, service.sessions.held)]  # fmt: skip


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    server = StandIn().start()
    try:
        yield server
    finally:
        server.stop()


def test_a_refused_request_leaves_the_registry_and_every_sidecar_as_they_were(
    stand_in: StandIn, otaku_home: Path
) -> None:
    """A chat played, with a branch and its summaries written; then each malformed request, sent
    through the HTTP layer, is a 400 (or 413) and changes nothing: not the sessions, their order,
    their state, nor a byte of any file under ~/.otaku/chats."""

    async def played() -> None:
        service = Service(settings_for(stand_in.url, summarize=True))
        async with TestClient(TestServer(service.app())) as client:
            for n in (50, 52):
                answer = await client.post("/v1/chat/completions", json={"model": "m", "messages": chat(n)})
                assert answer.status == 200
            for _ in range(2):  # a branch: a one-shot, then a chat
                answer = await client.post("/v1/chat/completions", json={"model": "m", "messages": BRANCH})
                assert answer.status == 200
            summarizer = service.summarizer
            assert summarizer is not None
            for _ in range(400):  # a hang guard: the summaries written in the background
                if files(otaku_home / "chats") and not summarizer.queue:
                    if not any(s.summaries.busy for s in service.sessions):
                        break
                await asyncio.sleep(0.05)
            assert len(service.sessions) == 2 and files(otaku_home / "chats")
            before, on_disk = registry(service), files(otaku_home / "chats")
            asked = len(stand_in.bodies)
            for how, body in malformed().items():
                answer = await client.post("/v1/chat/completions", json=body)
                said = await answer.json()
                assert answer.status in (400, 413) and said["error"]["type"] == "invalid_request_error", how
                assert registry(service) == before, how
                assert files(otaku_home / "chats") == on_disk, how
            assert len(stand_in.bodies) == asked  # nor was the backend asked

    asyncio.run(played())


def test_matching_a_request_changes_nothing() -> None:
    """`Sessions.match` is pure: asked of a new chat, an edit and a renaming, it leaves the registry
    as it was; `take` then does what it said."""
    from otaku_ctx.serve.chats import Chat

    sessions = Sessions()
    for _ in range(2):  # a one-shot, then a chat
        first = sessions.take(Chat("o1", False, "o1"), [("user", "a"), ("assistant", "b")])
    before = list(sessions)
    fork = sessions.match(Chat("o1", False, "o1"), [("user", "x"), ("assistant", "y")])
    renamed = sessions.match(Chat("n1", True, "o1"), [("user", "a")])
    new = sessions.match(Chat("o2", False, "o2"))
    assert list(sessions) == before and first.chat.key == "o1" and len(sessions) == 1
    assert fork.found is first and not fork.promoted  # its two messages edited: the same chat
    assert renamed.renamed == (first,) and new.found is None
    assert sessions.take(Chat("n1", True, "o1"), [("user", "a")]) is first and first.chat.named


# -- each failure carries its status -----------------------------------------------------------


def test_each_failure_says_its_status_type_and_code_the_same_in_both_encodings() -> None:
    import json

    from otaku_ctx.backend import TimedOut, Unreachable
    from otaku_ctx.errors import ConfigError
    from otaku_ctx.serve.errors import failure_of

    cases = {
        ChatError("messages[3]: role 'tool' cannot be assembled"): (400, "invalid_request_error", "invalid_request"),
        TimedOut("http://127.0.0.1:9/v1", "no reply within 1 s"): (504, "backend_error", "backend_timeout"),
        Unreachable("http://127.0.0.1:9/v1", "cannot connect"): (502, "backend_error", "backend_failed"),
        ConfigError("serve.backend", None, "no model server named"): (500, "server_error", "server_error"),
        ValueError("a bug"): (500, "server_error", "server_error"),
    }
    for error, (status, kind, code) in cases.items():
        failure = failure_of(error)
        said = failure.body()["error"]
        assert (failure.status, said["type"], said["code"]) == (status, kind, code), error
        assert said["message"].startswith("ctx serve: ") and "param" in said
        assert json.loads(failure.event().removeprefix(b"data: ")) == failure.body() == json.loads(failure.json())
    assert "a bug" not in failure_of(ValueError("a bug")).message  # its words are the log's, not the client's


def test_serve_takes_its_own_defaults_only_where_the_user_set_nothing(tmp_path: Path) -> None:
    """`cache`, `recall` and `speakers` unset: serve's "stable", 0.03 and "as_given"; set in a
    config, even to `ctx build`'s own defaults, the user's values stand; `config init` leaves
    them unset."""
    from otaku_ctx.config import default_toml, load_settings
    from otaku_ctx.serve.setup import serving

    def chosen(s: Settings) -> tuple[str, float, str]:
        return s.context.cache, s.context.recall, s.prompt.speakers

    assert chosen(serving(load_settings())) == ("stable", 0.03, "as_given")
    assert load_settings().context.recall == 0.0  # ctx build's own: otaku's cases as they are
    written = tmp_path / "config.toml"
    written.write_text(default_toml(), encoding="utf-8")
    assert chosen(serving(load_settings(written, explicit=True))) == ("stable", 0.03, "as_given")
    written.write_text('[context]\ncache = "exact"\nrecall = 0.0\n[prompt]\nspeakers = "labelled"\n', encoding="utf-8")
    assert chosen(serving(load_settings(written, explicit=True))) == ("exact", 0.0, "labelled")
