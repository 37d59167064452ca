"""A model's Jinja chat template as a format: loading it (a .jinja file, a tokenizer_config.json),
its stop strings, and the sandbox — a template is someone else's code, and every hostile
one ends in a one-line error naming it, in bounded time and memory."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from conftest import CASE3, FIXTURES, REPO, examples
from conftest import run as ctx
from ctx_run import ctx as ctx_in
from ctx_run import one_line
from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import chained_stories, run, shapes

from otaku_ctx.assemble import Shape
from otaku_ctx.errors import ConfigError, TemplateError
from otaku_ctx.hbs.blocks import Block
from otaku_ctx.model import INSTALL
from otaku_ctx.render import jinja
from otaku_ctx.render.formats import bind, jinja_format, load_format, render_text, text_pieces
from otaku_ctx.render.jinja import Limits, render_chat
from otaku_ctx.status import ExitStatus
from otaku_ctx.story.model import Story

TEMPLATES = FIXTURES / "chat-templates" / "templates"
CHATML = (TEMPLATES / "chatml.jinja").read_text(encoding="utf-8")
CHAT = [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Ilya:"}]
SMALL = Limits(chars=100_000, steps=200_000, seconds=60)  # a test's bound is its work; the seconds only a hang guard


@pytest.fixture(autouse=True)
def fresh_run() -> None:
    """Each test a run of its own: no template time spent yet."""
    jinja._spent.clear()


def rendered(template: str, limits: Limits = SMALL, **kwargs: object) -> str:
    return render_chat(template, CHAT, name="t.jinja", limits=limits, **kwargs)  # type: ignore[arg-type]


def refused(template: str, limits: Limits = SMALL) -> str:
    """The one-line error a template ends in."""
    with pytest.raises(TemplateError) as caught:
        rendered(template, limits)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("t.jinja")
    return message


# --- loading ---------------------------------------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_a_jinja_file_is_a_format(tmp_path: Path) -> None:
    fmt = load_format(str(write(tmp_path / "chatml.jinja", CHATML)), [])
    assert fmt.chat_template == CHATML and fmt.name == str(tmp_path / "chatml.jinja")
    assert (fmt.bos_token, fmt.eos_token, fmt.bos) == ("", "", "")
    assert fmt.stop == ("<|im_end|>",)  # the template's end of turn, though the file names no EOS
    blocks = [Block("user", "Hi."), Block("assistant", "Ilya:", open=True)]
    assert render_text(fmt, blocks) == "<|im_start|>user\nHi.<|im_end|>\n<|im_start|>assistant\nIlya:"
    assert render_text(fmt, blocks[:1]) == "<|im_start|>user\nHi.<|im_end|>\n<|im_start|>assistant\n"


def test_a_tokenizer_config_takes_its_default_template_and_token_objects(tmp_path: Path) -> None:
    config = {
        "chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": CHATML}],
        "bos_token": {"content": "<s>", "lstrip": False},
        "eos_token": "<|im_end|>",
    }
    fmt = load_format(str(write(tmp_path / "tokenizer_config.json", json.dumps(config))), [])
    assert (fmt.chat_template, fmt.bos_token, fmt.eos_token) == (CHATML, "<s>", "<|im_end|>")
    assert fmt.name == f"{tmp_path / 'tokenizer_config.json'} (chat_template)"


def test_a_tokenizer_config_without_a_template_reads_the_one_beside_it(tmp_path: Path) -> None:
    config = write(tmp_path / "tokenizer_config.json", json.dumps({"eos_token": "<|im_end|>", "bos_token": None}))
    write(tmp_path / "chat_template.jinja", CHATML)
    fmt = load_format(str(config), [])
    assert (fmt.chat_template, fmt.bos_token, fmt.eos_token) == (CHATML, None, "<|im_end|>")
    beside = load_format(str(tmp_path / "chat_template.jinja"), [])  # and the .jinja takes the config's tokens
    assert (beside.chat_template, beside.eos_token) == (CHATML, "<|im_end|>")


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"eos_token": "</s>"}, "tokenizer_config.json: chat_template: missing: this model has no chat template"),
        ({"chat_template": [{"name": "rag", "template": "x"}]}, "has no template named 'default' (it has: rag)"),
        ({"chat_template": 3}, "chat_template: expected a Jinja template (a string), got 3"),
        ({"chat_template": CHATML, "eos_token": 7}, "eos_token: expected a string or an object"),
        ({"chat_template": "{% for %}"}, "tokenizer_config.json (chat_template):1: not a valid Jinja template"),
    ],
)
def test_a_bad_tokenizer_config_is_one_line_naming_the_file(tmp_path: Path, config: object, expected: str) -> None:
    path = write(tmp_path / "tokenizer_config.json", json.dumps(config))
    with pytest.raises((ConfigError, TemplateError)) as caught:
        load_format(str(path), [])
    assert expected in str(caught.value) and str(path) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_template_that_is_not_jinja_names_the_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "broken.jinja", "{% for m in messages %}\n{{ m['content'] }\n{% endfor %}")
    with pytest.raises(TemplateError) as caught:
        load_format(str(path), [])
    assert str(caught.value).startswith(f"{path}:2: not a valid Jinja template: ")
    unknown = write(tmp_path / "unknown.jinja", "\n\n{{ messages | no_such_filter }}")
    with pytest.raises(TemplateError, match=r"unknown\.jinja:3: not a valid Jinja template: .*no_such_filter"):
        load_format(str(unknown), [])


@pytest.mark.parametrize(
    ("template", "said"),
    [
        # Python's own limits on the code Jinja compiles a template to
        ("{% for m in messages %}" * 25 + "{% endfor %}" * 25, "(Python cannot compile it: too many statically nested"),
        ("{% if messages %}" * 120 + "{% endif %}" * 120, "(Python cannot compile it: too many levels of indentation)"),
        # past the recursion of Jinja's parser and compiler
        ("{% if messages %}" * 2_500 + "{% endif %}" * 2_500, "it nests too deep to compile"),
        ("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "it nests too deep to compile"),
        # past the tokens ctx compiles (`jinja.TOKENS`): compiling costs ~3 KB a token
        ("{% if messages %}" * 100_000 + "{% endif %}" * 100_000, "holds more than 20,000 Jinja tokens"),
        ("{{x}}" * 400_000, "holds more than 20,000 Jinja tokens (tags, names, operators); no chat template is"),
    ],
    ids=["25 for", "120 if", "2,500 if", "5,000 parentheses", "100,000 if", "2 MB of {{x}}"],
)
def test_a_template_nested_past_python_s_limits_is_one_line(tmp_path: Path, template: str, said: str) -> None:
    path = write(tmp_path / "deep.jinja", template)
    with pytest.raises(TemplateError) as caught:
        load_format(str(path), [])
    assert str(caught.value).startswith(f"{path}: not a template ctx can run: ")
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_cli_names_the_template_in_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    strict = "{% if messages | length > 1 %}\n{{ raise_exception('One message only!') }}{% endif %}"
    strict += "{{ messages[0]['content'] }}"
    path = write(tmp_path / "strict.jinja", strict)
    code, out, err = ctx(capsys, "build", FIXTURES / "chat-templates" / "basic.jsonl", "--format", path)
    assert (code, out) == (1, "")
    assert err.strip().splitlines()[-1].endswith(f"{path}:2: the template refuses this chat: One message only!")


def test_stop_strings_are_the_eos_and_the_templates_end_of_turn() -> None:
    llama3 = (TEMPLATES / "llama3.jinja").read_text(encoding="utf-8")
    gemma = (TEMPLATES / "gemma-3.jinja").read_text(encoding="utf-8")
    assert jinja_format(llama3, bos="<|begin_of_text|>", eos="<|end_of_text|>", name="l").stop == (
        "<|end_of_text|>",
        "<|eot_id|>",
    )
    assert jinja_format(gemma, bos="<bos>", eos="<eos>", name="g").stop == ("<eos>", "<end_of_turn>")
    chatml = bind(jinja_format(CHATML, bos="", eos="<|im_end|>", name="c"), "{{char}}", "Ilya")
    assert chatml.stop == ("<|im_end|>",) and chatml.chat_template == CHATML


def test_the_open_turn_merges_into_the_characters_own_and_is_continued() -> None:
    fmt = jinja_format(CHATML, bos="", eos="", name="c")
    blocks = [Block("user", "Hi."), Block("assistant", "Ilya: Hello."), Block("assistant", "Ilya: ", open=True)]
    assert text_pieces(fmt, blocks) == ["<|im_start|>user\nHi.<|im_end|>\n<|im_start|>assistant\nIlya: Hello.\n\nIlya:"]


def test_a_template_that_drops_the_open_turns_text_cannot_continue_it() -> None:
    shout = "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}"
    with pytest.raises(TemplateError, match="leaves out part of the open turn's text"):
        rendered(shout, continue_final=True)
    with pytest.raises(TemplateError, match="never reads a message's content"):
        rendered("{% for m in messages %}{{ m.role }}{% endfor %}", continue_final=True)


def test_the_continued_message_keeps_its_spaces_unless_the_template_trims_them() -> None:
    chat = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Ilya:  "}]
    plain = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}"
    assert render_chat(plain, chat, name="t", continue_final=True) == "<Hi.><Ilya:  "
    trimmed = "{% for m in messages %}<{{ m['content'] | trim }}>{% endfor %}"
    assert render_chat(trimmed, chat, name="t", continue_final=True) == "<Hi.><Ilya:"


def test_strftime_now_is_todays_date() -> None:
    before = datetime.now().strftime("%Y-%m-%d")
    assert rendered("{{ strftime_now('%Y-%m-%d') }}") in (before, datetime.now().strftime("%Y-%m-%d"))  # midnight


# --- the sandbox -----------------------------------------------------------------------------


def test_raise_exception_is_the_templates_own_message_with_its_line() -> None:
    message = refused("{% if true %}\n{{ raise_exception('Conversation roles must alternate') }}\n{% endif %}")
    assert message == "t.jinja:2: the template refuses this chat: Conversation roles must alternate"


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__.__base__.__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os }}",
        "{{ messages.append(1) }}",
        "{{ namespace.__init__.__globals__['__builtins__'].open('/etc/passwd') }}",
    ],
)
def test_the_sandbox_refuses_attributes_that_climb_out(template: str) -> None:
    assert "sandbox stopped the template" in refused(template)


@pytest.mark.parametrize(
    "template", ["{{ ''.__class__ }}", "{{ dict.__class__ }}", "{{ raise_exception.__globals__ }}"]
)
def test_an_unsafe_attribute_is_undefined_as_in_transformers(template: str) -> None:
    assert rendered(template) == ""


@pytest.mark.parametrize("template", ["{% include '/etc/passwd' %}", "{% import 'os' as os %}", "{% extends 'x' %}"])
def test_no_file_system_and_no_imports(template: str) -> None:
    assert refused(template) == "t.jinja:1: the template failed (TypeError): no loader for this environment specified"


def test_a_namespace_takes_no_underscore_attribute() -> None:
    assert "cannot hold an attribute starting with '_'" in refused("{% set ns = namespace(_x=1) %}")
    assert "cannot hold" in refused("{% set ns = namespace() %}{% set ns._y = 2 %}")


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "runs past 200,000 steps"),
        ("{% for m in messages %}{% for i in range(100000) %}{{ '' }}{% endfor %}{% endfor %}", "runs past"),
        ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "writes more than 100,000 characters"),
        ("{% set a = 'xxxxxxxx' %}" + "{% set a = a ~ a %}" * 40 + "{{ a }}", "would make a concatenation of"),
        ("{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "a sum"),
        ("{{ 'x' * 10**10 }}", "would make a repetition of 10,000,000,000"),
        ("{{ [1] * 10**9 }}", "a repetition"),
        ("{{ 7 ** 100000000 }}", "a power"),
        ("{{ '%999999999d' % 1 }}", "a format width"),
        ("{{ '{:>999999999}'.format(1) }}", "a format width"),
        ("{{ 'x'.ljust(10**9) }}", "a string method's argument"),
        ("{{ '%*d' % (300000000, 1) }}", "a format width"),
        ("{{ '{0:{1[0]}}'.format('x', [300000000]) }}", "a string method's argument"),
        ("{{ '{:>{w[0]}}'.format('x', w=[300000000]) }}", "a string method's argument"),
        ("{{ 'x' | center(10**9) }}", "a filter's argument"),
        ("{{ 'ab' | replace('', 'y' * 90000) | replace('', 'z' * 90000) }}", "a replace"),
        ("{{ messages | tojson(indent=1000) }}", "asks for a JSON indent of 1,000"),
        ("{{ (['x' * 90000] * 90) | join }}", "would make a join of 180,000"),  # stopped at the second item
        # a text of a container, measured before Python makes it (issue 28 #5, #6)
        ("{{ ['x' * 90000] * 100000 }}", "would make a printed value of 180,0"),
        ("{{ ([[0] * 90000] * 90000) | join }}", "would make a join of 100,002"),
        ("{{ ['x' * 90000] * 100000 ~ '' }}", "would make a concatenation of 180,0"),
        ("{{ (['x' * 90000] * 100000) | tojson }}", "would make a filter's text of 180,0"),
        ("{{ (['x' * 90000] * 100000) | string }}", "would make a filter's text of 180,0"),
        ("{{ '%s' % [['x' * 90000] * 100000] }}", "would make a format of 180,0"),
        ("{{ '{}'.format(['x' * 90000] * 100000) }}", "would make a format of 180,0"),
        ("{{ {'a': ['x' * 90000] * 100000} }}", "would make a printed value of 180,0"),
        ("{% set ns = namespace(a=['x' * 90000] * 100000) %}{{ ns }}", "would make a printed value of 180,0"),
        ("{{ ([[0] * 90000] * 90000) | map('join') | join }}", "would make a join of 180,000"),
        ("{{ (['x' * 90000] * 9) | join('y' * 90000) }}", "a join"),
        ("{{ ''.join(['x' * 90000] * 90) }}", "a join"),
        ("{{ ''.join(range(50000) | map('string') | map('center', 99000)) }}", "would make a join of 198,000"),
        ("{{ range(50000) | map('string') | map('center', 99000) | join }}", "would make a join of 198,000"),
        ("{{ ('x\n' * 40000) | indent(90000) }}", "an indent"),
        ("{{ lipsum(n=1000000) }}", "paragraphs of up to 100 words of lorem ipsum"),
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recurses too deep"),
    ],
)
def test_a_hostile_template_stops_in_one_line(template: str, expected: str) -> None:
    """Stopped by the bound on its work that `expected` names (steps, characters, a size asked
    for, recursion), not by the clock: `SMALL`'s seconds are only a hang guard."""
    message = refused(template)
    assert "stopped: the template" in message and expected in message


def test_a_container_within_the_bound_prints_as_python_prints_it() -> None:
    """The measure of a container's text only refuses; what passes prints as before, and a long
    list a filter keeps as it is (its length, its first item) is no text at all."""
    assert rendered("{{ [1, 'a', none, {'k': [2.5]}] }}") == "[1, 'a', None, {'k': [2.5]}]"
    assert rendered("{{ (['x' * 90000] * 100000) | length }}|{{ (['x' * 90000] * 100000) | first | length }}") == (
        "100000|90000"
    )
    assert rendered("{{ [[1, 2], [3]] | map('join', '-') | join(',') }}") == "1-2,3"


@pytest.mark.parametrize(
    ("value", "text"),
    [([1, "ab", None], "[1, 'ab', None]"), ({"a": (1, 2)}, "{'a': (1, 2)}"), ([[0] * 300] * 2, str([[0] * 300] * 2))],
)
def test_the_measure_of_a_text_is_near_its_length(value: object, text: str) -> None:
    """`printed` never makes the text, and is close to it: at most its length, and more than
    half of it."""
    assert len(text) / 2 < jinja.printed(value, 10**6) <= len(text) + 2


def test_the_measure_of_a_long_list_stops_past_the_bound() -> None:
    """A list of a million lists of a million items: measured in about `bound` items, not 10**12."""
    seen = 0

    class Counted(list[object]):
        def __iter__(self) -> Iterator[object]:
            nonlocal seen
            for item in super().__iter__():
                seen += 1
                yield item

    inner = Counted([0] * 1_000_000)
    assert jinja.printed(Counted([inner] * 1_000_000), 100_000) > 100_000
    assert seen <= 100_000


class Ticking:
    """The clock jinja's time bounds read, moving 10 ms each time it is read: a render reads it
    at its start, every 64 steps and at its end, so seconds on it are counted in steps, the
    same on any machine."""

    def __init__(self) -> None:
        self.now, self.reads = 0.0, 0

    def monotonic(self) -> float:
        self.reads += 1
        self.now += 0.01
        return self.now


def test_a_loop_without_end_stops_at_the_time_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The render stops at its first look at the clock past 0.3 s, long before its million steps."""
    clock = Ticking()
    monkeypatch.setattr(jinja, "time", clock)
    loop = "{% for i in range(100000) %}"
    forever = loop * 3 + "{% endfor %}" * 3
    message = refused(forever, Limits(chars=1000, steps=1_000_000, seconds=0.3))
    assert "runs past 0.3 s" in message
    assert clock.reads <= 0.3 / 0.01 + 3  # its start, a look every 64 steps until one is past, its end


def test_a_templates_renders_share_the_runs_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A template slow enough to pass each render's bound still ends: its renders of one run
    share `RUN_SECONDS`."""
    monkeypatch.setattr(jinja, "RUN_SECONDS", 0.5)
    monkeypatch.setattr(jinja, "time", Ticking())
    slow = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
    limits = Limits(chars=1000, steps=1_000_000, seconds=0.3)
    assert "runs past 0.3 s" in refused(slow, limits)
    assert refused(slow, limits) == "t.jinja:1: stopped: the template has taken 0.5 s of this run"
    assert refused(slow, limits) == "t.jinja: stopped: the template has taken 0.5 s of this run"  # not run again


def test_the_default_bounds_leave_room_for_a_long_chat() -> None:
    chat = [{"role": "user", "content": "x" * 500_000}] * 4
    limits = jinja.limits_for(chat)
    assert limits.chars > 4 * 500_000 + 1_000_000
    assert len(render_chat(CHATML, chat, name="c")) > 2_000_000


# --- jinja2, optional ------------------------------------------------------------------------


def test_formats_does_not_import_jinja2() -> None:
    code = "import sys, otaku_ctx.render.formats, otaku_ctx.render.jinja; assert 'jinja2' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_without_jinja2_a_template_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "jinja2", None)
    monkeypatch.setitem(sys.modules, "jinja2.ext", None)
    monkeypatch.setitem(sys.modules, "jinja2.sandbox", None)
    jinja._environment.cache_clear()
    jinja.compiled.cache_clear()
    try:
        with pytest.raises(ConfigError) as caught:
            jinja_format("{{ messages }}", bos="", eos="", name="model.gguf (tokenizer.chat_template)")
        assert str(caught.value) == (
            f"model.gguf (tokenizer.chat_template): a Jinja chat template needs jinja2: {INSTALL}"
        )
    finally:
        jinja._environment.cache_clear()
        jinja.compiled.cache_clear()


# --- the budget holds with a model's template ----------------------------------------------


@pytest.fixture(scope="session")
def jinja_configs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each template with its model's BOS/EOS, as a model folder's tokenizer_config.json holds
    them (in pytest's own temporary folder, which it cleans up)."""
    folder = tmp_path_factory.mktemp("jinja-configs")
    for name, entry in json.loads((FIXTURES / "jinja" / "templates.json").read_text(encoding="utf-8")).items():
        source = (FIXTURES / "jinja" / entry["path"]).read_text(encoding="utf-8")
        data = {"chat_template": source, "bos_token": entry["bos"] or None, "eos_token": entry["eos"] or None}
        write(folder / name / "tokenizer_config.json", json.dumps(data))
    return folder


@given(
    chained_stories(),
    shapes,
    st.floats(0.05, 1.2),
    st.integers(0, 40),
    st.sampled_from(["text", "openai-completion"]),
    st.sampled_from(["chatml", "llama3.1", "mistral", "mistral-v7-tekken", "gemma-3", "gemma-2"]),
)
@settings(max_examples=examples(15))  # about 0.2 s an example
def test_invariants_with_a_models_template(
    jinja_configs: Path, s: Story, shape: Shape, fraction: float, reserve: int, emit: str, template: str
) -> None:
    """Random stories (system turns anywhere, the assistant first, look-alikes of control
    tokens) within the limit through strict and lenient templates alike: none refused."""
    run(
        s,
        shape,
        fraction,
        reserve,
        emit,
        "cl100k_base",
        "default",
        str(jinja_configs / template / "tokenizer_config.json"),
    )


def test_a_generation_block_renders_its_body_in_place() -> None:
    """`{% generation %}` (transformers' tag around the assistant's turns, for masking them in
    training): the body rendered where it stands, as transformers renders it; a template
    that uses it renders what the same template without the tags renders."""
    tagged = (
        "{% for m in messages %}{% if m.role == 'assistant' %}<a>{% generation %}{{ m.content }}<end>"
        "{% endgeneration %}{% else %}<u>{{ m.content }}{% endif %}{% endfor %}"
    )
    plain = tagged.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    chat = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]
    assert render_chat(tagged, chat, name="t") == render_chat(plain, chat, name="t") == "<u>Hi.<a>Hello.<end>"


# -- #13: a chat template nested past Python's own limits -----------------------------------


@pytest.mark.parametrize(
    "template",
    ["{% for m in messages %}" * 25 + "{% endfor %}" * 25, "{% if messages %}" * 120 + "{% endif %}" * 120],
    ids=["25 for", "120 if"],
)
def test_a_chat_template_nested_past_python_s_limits(tmp_path: Path, template: str) -> None:
    path = tmp_path / "deep.jinja"
    path.write_text(template, encoding="utf-8")
    code, out, err = ctx_in("build", CASE3, "--format", path)
    assert (code, out) == (ExitStatus.ERROR, "")
    assert one_line(err).startswith(f"ctx: {path}: not a template ctx can run: its blocks nest too deep (Python")
