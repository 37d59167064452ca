"""Stored programs: shipped ones up to date, the user cache robust, and no parser on a normal run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from otaku_ctx.config import DEFAULT_CARD_TEMPLATE
from otaku_ctx.errors import TemplateError
from otaku_ctx.hbs import Template, cached_template, compile_template
from otaku_ctx.hbs import compile as hbs_compile
from otaku_ctx.hbs.program import ENGINE_VERSION, FORMAT, DamagedProgram, link
from otaku_ctx.hbs.store import template_key
from otaku_ctx.locations import shipped, template_cache
from otaku_ctx.render.ship import shipped_programs

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = REPO / "configs" / "templates"

USER_TEMPLATE = (
    "{{#systemBlock}}{{title}}{{/systemBlock}}"
    "{{#each chatMessages as |m i|}}{{#userBlock}}{{i}} {{m.name}}: {{json m.message}}{{/userBlock}}{{/each}}"
)
CONTEXT = {"title": "T", "chatMessages": [{"name": "Mara", "message": "Hi"}, {"name": "Ilya", "message": "Yo"}]}


def cached(source: str, name: str, cache: Path | None = None) -> Template:
    """The store as `ctx` uses it: the shipped programs, then the user's cache (`locations`)."""
    return cached_template(source, name, shipped=shipped("templates/compiled"), cache=cache or template_cache())


def program_of(source: str) -> list:
    return hbs_compile.compile_program(source, "t.hbs")


def refuse_to_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    def parse(source: str, name: str) -> list:
        raise AssertionError(f"{name} was parsed, but a stored program should have been used")

    monkeypatch.setattr(hbs_compile, "compile_program", parse)


# --- shipped programs ---------------------------------------------------------------------------


def test_every_shipped_program_is_up_to_date_with_its_source() -> None:
    folder = shipped("templates/compiled").resolve()
    assert folder == TEMPLATES / "compiled"
    wanted = shipped_programs(TEMPLATES)
    found = {path.name: path.read_text(encoding="utf-8") for path in folder.glob("*.json")}
    stale = sorted(set(found) ^ set(wanted)) + sorted(n for n in wanted if n in found and found[n] != wanted[n])
    assert not stale, f"stale shipped programs {stale}: run `python -m otaku_ctx.render.ship` and commit the result"
    labels = {json.loads(text)["source"] for text in wanted.values()}
    assert labels == {"configs/templates/default.hbs", "configs/templates/serene.hbs",
                      "configs/templates/sillytavern.hbs", "otaku_ctx.config.DEFAULT_CARD_TEMPLATE"}  # fmt: skip


@pytest.mark.parametrize("source", [p.read_text(encoding="utf-8") for p in sorted(TEMPLATES.glob("*.hbs"))])
def test_shipped_templates_load_without_parsing(source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = compile_template(source, "t").render(CONTEXT)
    refuse_to_parse(monkeypatch)
    assert cached(source, "t").render(CONTEXT) == expected


def test_a_normal_run_never_imports_the_parser(tmp_path: Path) -> None:
    """Render every shipped template (and the default card template) in a fresh interpreter."""
    script = (
        "import sys\n"
        "from otaku_ctx.render.lookup import load_template, compiled\n"
        "from otaku_ctx.config import DEFAULT_CARD_TEMPLATE\n"
        "for name in ('default', 'serene', 'sillytavern'):\n"
        "    load_template(name).render({'chatMessages': [{'name': 'A', 'message': 'hi'}]})\n"
        "compiled(DEFAULT_CARD_TEMPLATE, 'card').render_text({'name': 'Ilya'})\n"
        "print(sorted(m for m in sys.modules if m.startswith(('pybars', 'pymeta'))))\n"
    )
    env = {"OTAKU_HOME": str(tmp_path), "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert not (tmp_path / "cache").exists()  # shipped programs are never copied into the cache


# --- the user cache -----------------------------------------------------------------------------


def test_a_user_template_is_parsed_once_then_read_from_the_cache(
    otaku_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = otaku_home / "cache" / "templates" / f"{template_key(USER_TEMPLATE)}.json"
    first = cached(USER_TEMPLATE, "mine.hbs").render(CONTEXT)
    stored = json.loads(entry.read_text(encoding="utf-8"))
    assert (stored["format"], stored["engine"], stored["source"]) == (FORMAT, ENGINE_VERSION, "mine.hbs")
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]  # no temp file left behind
    refuse_to_parse(monkeypatch)
    assert cached(USER_TEMPLATE, "other-name.hbs").render(CONTEXT) == first


def test_the_key_changes_with_the_content_and_the_engine_version(monkeypatch: pytest.MonkeyPatch) -> None:
    key = template_key(USER_TEMPLATE)
    assert template_key(USER_TEMPLATE + " ") != key
    monkeypatch.setattr("otaku_ctx.hbs.store.ENGINE_VERSION", ENGINE_VERSION + 1)
    assert template_key(USER_TEMPLATE) != key


def _stored(**change: object) -> bytes:
    stored = {
        "format": FORMAT,
        "engine": ENGINE_VERSION,
        "key": template_key(USER_TEMPLATE),
        "source": "x",
        "program": program_of(USER_TEMPLATE),
    }
    return json.dumps(stored | change).encode()


DAMAGED = {
    "empty": b"",
    "not json": b"\x00\xff garbage",
    "truncated": _stored()[:-7],
    "not utf-8": b'{"format": "\xff"}',
    "a list": b"[]",
    "other engine version": _stored(engine=ENGINE_VERSION + 1),
    "other format": _stored(format="pickle"),
    "other key": _stored(key="0" * 64),
    "no program": _stored(program=None),
    "unknown step": _stored(program=[["exec", "import os"]]),
    "unknown helper": _stored(program=[["print", ["call", "__import__", [["const", "os"]], 1, 1]]]),
    "block param out of scope": _stored(program=[["print", ["param", 0, 0, []]]]),
    "nested role blocks": _stored(program=[["role", "user", [["role", "system", []]]]]),
    "a constant that is an object": _stored(program=[["print", ["const", {"a": 1}]]]),
    "nested too deeply": b"[" * 100_000 + b"]" * 100_000,
    "a huge number": b'{"engine": ' + b"9" * 5000 + b"}",
}


@pytest.mark.parametrize("content", DAMAGED.values(), ids=DAMAGED.keys())
def test_a_damaged_cache_entry_is_ignored_and_rebuilt(content: bytes, otaku_home: Path) -> None:
    expected = compile_template(USER_TEMPLATE, "t").render(CONTEXT)
    entry = otaku_home / "cache" / "templates" / f"{template_key(USER_TEMPLATE)}.json"
    entry.parent.mkdir(parents=True)
    entry.write_bytes(content)
    assert cached(USER_TEMPLATE, "t").render(CONTEXT) == expected
    assert json.loads(entry.read_text(encoding="utf-8"))["program"] == program_of(USER_TEMPLATE)


def test_an_unreadable_cache_entry_is_rebuilt_around(otaku_home: Path) -> None:
    entry = otaku_home / "cache" / "templates" / f"{template_key(USER_TEMPLATE)}.json"
    entry.mkdir(parents=True)  # a directory where the entry should be: cannot be read or replaced
    assert cached(USER_TEMPLATE, "t").render_text(CONTEXT).startswith("T")


def test_a_cache_that_cannot_be_written_is_not_an_error(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    assert cached(USER_TEMPLATE, "t", cache=blocked / "templates").render_text(CONTEXT).startswith("T")


def test_a_bad_template_is_still_a_template_error_and_is_not_cached(otaku_home: Path) -> None:
    with pytest.raises(TemplateError, match=r"bad\.hbs:1:1: .*never closed"):
        cached("{{#if x}}", "bad.hbs")
    assert not (otaku_home / "cache" / "templates").exists() or not any((otaku_home / "cache").rglob("*.json"))


# --- what a stored program may say --------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        USER_TEMPLATE,
        DEFAULT_CARD_TEMPLATE,
        "{{#each xs as |x i|}}{{#with ../o as |p|}}{{p.k}}{{x}}{{@../index}}{{/with}}{{else}}none{{/each}}",
        "{{#unless a}}{{lookup xs 1}}{{else if (or b (not c))}}{{@root.t}}{{/unless}}{{^missing}}M{{/missing}}{{trim}}",
        "{{../../x}}{{this.y}}{{[odd key]}}{{json (eq 1.5 -2)}}",
    ],
)
def test_a_program_through_json_renders_as_the_compiled_template(source: str) -> None:
    context = {"xs": ["a", "b"], "o": {"k": "K"}, "a": 0, "b": False, "c": True, "t": "T", "odd key": "!", "y": 1}
    stored = json.loads(json.dumps(program_of(source)))
    assert link(stored, "t").render(context) == compile_template(source, "t").render(context)


def test_a_stored_program_reaches_only_data() -> None:
    program = [["print", ["path", 0, ["__class__"]]], ["print", ["key", "__dict__"]], ["print", ["key", "s"]]]
    assert link(program, "t").render_text({"s": "ok"}) == "ok"


@pytest.mark.parametrize("program", [v for k, v in DAMAGED.items() if k.startswith(("unknown", "block", "nested r"))])
def test_link_refuses_what_no_template_compiles_to(program: bytes) -> None:
    with pytest.raises(DamagedProgram):
        link(json.loads(program)["program"], "t")


def test_inverted_blocks_take_no_block_params() -> None:
    with pytest.raises(TemplateError, match=r"block params need \{\{#each\}\}"):
        compile_template("{{^each xs as |x|}}{{x}}{{/each}}", "t")
