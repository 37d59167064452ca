"""Benchmark: `ctx build` against otaku 0.8's own assembler and against the floor, whole process.

    python benchmarks/bench.py                     # 1k, 10k, 100k, 300k messages, 11 runs each
    python benchmarks/bench.py --quick             # 1k and 10k, 3 runs
    python benchmarks/bench.py --smoke             # once, small: 1k, 1 run, every section (benchmarks/smoke.sh)
    python benchmarks/bench.py --sizes 1000 --repeats 9 --startup
    python benchmarks/bench.py --ctx /work/venv/bin/ctx --no-otaku
    python benchmarks/bench.py --sizes 1000 --no-otaku --counters ~/.cache/otaku-ctx/smollm2-0.1.2/*.gguf

Every figure is a whole process, timed from spawn to exit, with its peak RSS read from the
child's own rusage (wait4; it never reads below what this small parent held, ~20 MB, the
size of a bare `python -c pass`). For each size it times, in rounds of one run of each (so
that the machine's drift falls on every column alike):

- floor: the configured Python starting, importing json and reading the story file — what
  any Python tool pays before it does anything; "+parse" also json-decodes every line
  (the standard library's json: issue 24's parse floor), "+orjson" decodes them with orjson,
  line by line, as ctx's reader does.
- ctx: `ctx build STORY --template T` for each template (`default`, `serene`), run from the
  checkout this script lives in (`PYTHONPATH=<repo> <python> -c "...entry()"`) with the
  interpreter given by --python (default: the one running this script), or the command
  given by --ctx (e.g. an installed `ctx`). OTAKU_HOME points at an empty folder in the
  cache, so no user config changes the figures; window, head and tail are passed explicitly.
- otaku: otaku 0.8.0's `assemble_story` on the same story, converted to otaku's Markdown
  export by otaku's own writer and read back by otaku's own parser (otaku_adapter.py says
  exactly what is and is not timed). otaku is installed with pip into a venv in the cache
  on first use; when that fails (no registry), its column says so and the rest runs.
- yardstick: a fixed loop of pure Python, the machine's speed during those rounds. The
  machines here are shared and drift within a session; compare two runs at equal yardsticks.

Then one in-process run per size and template of phases.py: where ctx's time goes.
--startup adds `ctx --version` / `ctx --help` times and the top imports of
`python -X importtime -c "import otaku_ctx.cli.app"`.

Generated stories and otaku's venv live in the cache folder (--cache-dir, default
~/.cache/otaku-ctx-bench), never in the repository. A process slower than --slow seconds is
run once; one slower than --timeout seconds is stopped and reported as ">timeout".

--smoke runs every section once at a small size (1,000 messages, one run after the warm-up,
--startup, the counter "estimate" beside the default), to show the benchmark still works
rather than to measure: anything a full run reports and goes on past (a ctx or otaku run that
fails or times out, otaku not installed, the phases unavailable) makes it exit 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent

OTAKU_VERSION = "0.8.0"
SIZES = [1_000, 10_000, 100_000, 300_000]
QUICK_SIZES = [1_000, 10_000]
SMOKE_SIZES = [1_000]
TEMPLATES = ["default", "serene"]
ENTRY = "import sys; from otaku_ctx.__main__ import entry; sys.argv[0] = 'ctx'; entry()"
FLOOR = "import json, sys\nwith open(sys.argv[1], encoding='utf-8') as f: f.read()"
PARSE = "import json, sys\nwith open(sys.argv[1], encoding='utf-8') as f:\n    for line in f: json.loads(line)"
PARSE_ORJSON = "import orjson, sys\nwith open(sys.argv[1], 'rb') as f:\n    for line in f: orjson.loads(line)"
# The machine's speed while the row was timed: a fixed loop of pure Python. This workplace's
# machines are shared and their speed drifts within a session (this loop has read 210 ms and
# 350 ms a minute apart); figures from two runs compare only at the same yardstick.
YARDSTICK = "s = 0\nfor i in range(3_000_000): s += i"


# ---------- running one child ----------


@dataclass
class Run:
    seconds: float
    rss_mb: float
    code: int | None  # None: stopped at the timeout
    out_bytes: int
    err: str


def run_once(command: list[str], env: dict[str, str], scratch: Path, timeout: float) -> Run:
    """Spawn `command`, wait for it with wait4 and return its wall time and peak RSS.
    stdout and stderr go to files so a big prompt can never block on a pipe."""
    out_path, err_path = scratch / "stdout", scratch / "stderr"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        start = time.perf_counter()
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env)
        stopped = threading.Event()

        def stop() -> None:
            stopped.set()
            child.kill()

        timer = threading.Timer(timeout, stop) if timeout > 0 else None
        if timer:
            timer.start()
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
        if timer:
            timer.cancel()
        child.returncode = os.waitstatus_to_exitcode(status)  # so Popen does not wait again
    return Run(
        seconds=seconds,
        rss_mb=usage.ru_maxrss / 1024,  # kilobytes on Linux
        code=None if stopped.is_set() else child.returncode,
        out_bytes=out_path.stat().st_size,
        err=err_path.read_text(encoding="utf-8", errors="replace").strip(),
    )


@dataclass
class Measure:
    runs: list[Run] = field(default_factory=list)
    note: str = ""
    cut: bool = False  # fewer runs than asked: one was slower than --slow or timed out

    @property
    def median(self) -> float | None:
        done = [r.seconds for r in self.runs if r.code is not None]
        return statistics.median(done) if done and len(done) == len(self.runs) else None

    @property
    def rss(self) -> float | None:
        return max(r.rss_mb for r in self.runs) if self.runs else None

    @property
    def code(self) -> int | None:
        return self.runs[-1].code if self.runs else None

    def cell(self) -> str:
        if not self.runs:
            return self.note or "-"
        if self.code is None:
            return f">{self.runs[-1].seconds:.0f}s"
        text = seconds(self.median)
        if self.code != 0:
            text += f" !{self.code}"
        return text + ("¹" if self.cut and len(self.runs) == 1 else "")


def measure(
    command: list[str], env: dict[str, str], scratch: Path, repeats: int, slow: float, timeout: float
) -> Measure:
    m = Measure()
    # A first run writes bytecode and caches and brings the files into the page cache; it is
    # not counted, unless it is slow (then it is the one run reported, marked ¹).
    first = run_once(command, env, scratch, timeout)
    if first.code is None or first.seconds > slow:
        m.runs.append(first)
        m.cut = True
        return m
    for _ in range(repeats):
        r = run_once(command, env, scratch, timeout)
        m.runs.append(r)
        if r.code is None or r.seconds > slow:
            m.cut = True
            break
    return m


def interleaved(
    jobs: dict[str, tuple[list[str], dict[str, str], float]], scratch: Path, repeats: int, slow: float
) -> dict[str, Measure]:
    """Measure several commands (name -> command, env, timeout) in rounds, one run of each a
    round, so that the machine's drift (other load, clock speed) falls on every column alike
    and the ratios between them hold. Warm-up and slow runs as in `measure`."""
    out: dict[str, Measure] = {}
    live: list[str] = []
    for name, (command, env, timeout) in jobs.items():
        out[name] = Measure()
        first = run_once(command, env, scratch, timeout)
        if first.code is None or first.seconds > slow:
            out[name].runs.append(first)
            out[name].cut = True
        else:
            live.append(name)
    for _ in range(repeats):
        for name in list(live):
            command, env, timeout = jobs[name]
            r = run_once(command, env, scratch, timeout)
            out[name].runs.append(r)
            if r.code is None or r.seconds > slow:
                out[name].cut = True
                live.remove(name)
    return out


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if value < 10 else f"{value:.1f}s"


def ratio(a: Measure, b: Measure) -> str:
    if a.median is None or not b.runs:
        return "-"
    if b.code is None:  # b timed out: a is at most this fraction of it
        return f"<{a.median / b.runs[-1].seconds:.2g}"
    if b.median is None:
        return "-"
    value = a.median / b.median
    return f"{value:.2f}" if value >= 0.1 else f"{value:.2g}"


# ---------- what is compared ----------


@dataclass
class Setup:
    ctx: list[str]  # the command that runs `ctx`
    python: str  # the interpreter for the floor, phases.py and -X importtime
    env: dict[str, str]
    otaku: str | None  # otaku's venv python, or None
    otaku_note: str
    cache: Path
    scratch: Path
    problems: list[str] = field(default_factory=list)  # what --smoke exits 1 for


def ctx_setup(args: argparse.Namespace, cache: Path) -> tuple[list[str], dict[str, str]]:
    home = cache / "otaku-home"  # an empty OTAKU_HOME: no user config in the figures
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OTAKU_HOME=str(home), PYTHONPATH=str(args.repo))
    env.pop("PYTHONIOENCODING", None)
    # An installed ctx runs from bytecode (pip compiles it); a shell that sets
    # PYTHONDONTWRITEBYTECODE would time compiling every module on every run instead.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    command = shlex.split(args.ctx) if args.ctx else [args.python, "-c", ENTRY]
    return command, env


def otaku_setup(args: argparse.Namespace, cache: Path) -> tuple[str | None, str]:
    """otaku 0.8's interpreter: --otaku-python, or a venv in the cache, made on first use."""
    if args.no_otaku:
        return None, "skipped (--no-otaku)"
    if args.otaku_python:
        return args.otaku_python, ""
    venv = cache / f"otaku-{OTAKU_VERSION}-venv"
    python = venv / "bin" / "python"
    check = [str(python), "-c", f"import otaku, sys; sys.exit(otaku.__version__ != {OTAKU_VERSION!r})"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return str(python), ""
    print(f"installing otaku {OTAKU_VERSION} into {venv} ...", file=sys.stderr)
    try:
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--clear", str(venv)], check=True, capture_output=True, timeout=300)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"otaku=={OTAKU_VERSION}"],
            check=True,
            capture_output=True,
            timeout=900,
        )
        subprocess.run(check, check=True, capture_output=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        detail = getattr(e, "stderr", b"") or b""
        last = detail.decode(errors="replace").strip().splitlines()[-1:] or [str(e)]
        return None, f"otaku {OTAKU_VERSION} could not be installed ({last[0][:120]}); skipped"
    return str(python), ""


def story_for(n: int, cache: Path) -> Path:
    """The generated story of n messages, cached by the generator's own source."""
    key = hashlib.sha256((HERE / "storygen.py").read_bytes()).hexdigest()[:10]
    path = cache / "stories" / f"story-{n}-{key}.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".part")
        # In a child: a peak RSS read from rusage includes what the parent held when it forked,
        # so this process must never hold a whole story.
        subprocess.run([sys.executable, str(HERE / "storygen.py"), "story", str(n), str(partial)], check=True)
        partial.replace(path)
    return path


def export_for(story: Path, otaku: str) -> Path:
    export = story.with_suffix(".otaku.md")
    if not export.exists():
        partial = export.with_suffix(".part")
        subprocess.run([otaku, str(HERE / "otaku_adapter.py"), "export", str(story), str(partial)], check=True)
        partial.replace(export)
    return export


# ---------- the sections ----------


def startup(s: Setup, args: argparse.Namespace) -> None:
    print(f"\n## start-up (median of {args.repeats} runs)\n")
    floor = measure([s.python, "-c", "pass"], s.env, s.scratch, args.repeats, args.slow, args.timeout)
    print(f"{'command':<34} {'median':>8} {'peak RSS':>9}")
    print(f"{'python -c pass':<34} {floor.cell():>8} {floor.rss:>7.0f}MB")
    for flag in ("--version", "--help"):
        m = measure([*s.ctx, flag], s.env, s.scratch, args.repeats, args.slow, args.timeout)
        print(f"{'ctx ' + flag:<34} {m.cell():>8} {m.rss:>7.0f}MB")
        if m.code != 0:
            s.problems.append(f"ctx {flag}: exit {m.code}: {m.runs[-1].err[-200:]}")
    done = subprocess.run(
        [s.python, "-X", "importtime", "-c", "import otaku_ctx.cli.app"], env=s.env, capture_output=True, text=True
    )
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, total, name = (part.strip() for part in line[len("import time:") :].split("|"))
        rows.append((int(own), int(total), name))
    if not rows:
        print(f"\nimporttime: no output ({done.stderr.strip()[-200:]})")
        s.problems.append("importtime: no output")
        return
    whole = next((t for _, t, name in rows if name.strip() == "otaku_ctx.cli.app"), max(t for _, t, _ in rows))
    print(f"\n`python -X importtime -c 'import otaku_ctx.cli.app'`: {whole / 1000:.0f}ms in all; top 20 by own time\n")
    print(f"{'own':>8} {'cumulative':>11}  module")
    for own, total, name in sorted(rows, reverse=True)[:20]:
        print(f"{own / 1000:>6.1f}ms {total / 1000:>9.1f}ms  {name.strip()}")


def sizes(s: Setup, args: argparse.Namespace) -> None:
    flags = ["--window", str(args.window), "--head", str(args.head), "--tail", str(args.tail)]
    if args.tokenizer:
        flags += ["--tokenizer", args.tokenizer]
    rows = []
    for n in args.sizes:
        story = story_for(n, s.cache)
        row: dict[str, object] = {"n": n, "mb": story.stat().st_size / 1e6}
        print(f"{n:,} messages ({row['mb']:.1f} MB) ...", file=sys.stderr, flush=True)
        jobs = {
            "floor": ([s.python, "-c", FLOOR, str(story)], s.env, args.timeout),
            "parse": ([s.python, "-c", PARSE, str(story)], s.env, args.timeout),
            "orjson": ([s.python, "-c", PARSE_ORJSON, str(story)], s.env, args.timeout),
            "yardstick": ([s.python, "-c", YARDSTICK], s.env, args.timeout),
        }
        for template in args.templates:
            jobs[template] = ([*s.ctx, "build", str(story), "--template", template, *flags], s.env, args.timeout)
        for spec in args.counters:  # the first template, counted by another tokenizer, in the same rounds
            command = [*s.ctx, "build", str(story), "--template", args.templates[0], *flags, "--tokenizer", spec]
            jobs[counter_label(spec)] = (command, s.env, args.timeout)
        if s.otaku:
            export = export_for(story, s.otaku)
            command = [s.otaku, str(HERE / "otaku_adapter.py"), "build", str(export), *flags[:6]]
            otaku_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            jobs["otaku"] = (command, otaku_env, args.otaku_timeout)
        row.update(interleaved(jobs, s.scratch, args.repeats, args.slow))
        for template in args.templates:
            m = row[template]
            assert isinstance(m, Measure)
            if m.code not in (0, None):
                m.note = m.runs[-1].err.splitlines()[-1][:160] if m.runs[-1].err else "no message"
            elif m.code == 0 and not m.runs[-1].out_bytes:
                m.note = "exit 0 but nothing on stdout"
        if not s.otaku:
            row["otaku"] = Measure(note="n/a")
        row["phases"] = {t: phases(s, story, t, flags) for t in args.templates} if args.phases else {}
        s.problems += failures(row)
        rows.append(row)
    report(rows, s, args)


def failures(row: dict) -> list[str]:
    """What went wrong in one size's row: a column whose last run failed or timed out, a ctx
    run with nothing on stdout, a phase breakdown unavailable."""
    found = []
    for name, m in row.items():
        if isinstance(m, Measure) and m.runs and (m.code != 0 or m.note):
            detail = m.note or (m.runs[-1].err.splitlines() or ["no message"])[-1][:160]
            found.append(f"{row['n']:,} {name}: exit {m.code}: {detail}")
    for template, p in row["phases"].items():
        if isinstance(p, str):
            found.append(f"{row['n']:,} phases ({template}): {p}")
    return found


def phases(s: Setup, story: Path, template: str, flags: list[str]) -> dict | str:
    command = [s.python, str(HERE / "phases.py"), str(story), "--template", template, *flags]
    done = subprocess.run(command, env=s.env, capture_output=True, text=True)
    try:
        return json.loads(done.stdout)
    except ValueError:
        return "unavailable: " + (done.stderr.strip().splitlines() or ["no output"])[-1][:120]


def counter_label(spec: str) -> str:
    """A column's name for a --tokenizer value: a file by its name."""
    return f"ctx {Path(spec).name}" if os.sep in spec or "." in spec else f"ctx {spec}"


def report(rows: list[dict], s: Setup, args: argparse.Namespace) -> None:
    t = args.templates
    first, second = t[0], t[-1]
    print(f"\n## whole process, median of {args.repeats} runs (¹ = one run: slower than {args.slow:g}s)\n")
    heads = ["messages", "file", "floor", "+parse", "+orjson", *[f"ctx {x}" for x in t], "otaku 0.8", "yardstick"]
    print("| " + " | ".join(heads) + " |")
    print("|" + "|".join("---:" for _ in heads) + "|")
    for r in rows:
        cells = [f"{r['n']:,}", f"{r['mb']:.1f}MB", r["floor"].cell(), r["parse"].cell(), r["orjson"].cell()]
        cells += [r[x].cell() for x in t] + [r["otaku"].cell(), r["yardstick"].cell()]
        print("| " + " | ".join(cells) + " |")
    print("\n## ratios (below 1: ctx is faster)\n")
    floors = [("floor", "floor"), ("parse", "+parse"), ("orjson", "+orjson")]
    heads = ["messages", *[f"{x}/otaku" for x in t], *[f"{x}/{shown}" for _, shown in floors for x in t]]
    if len(t) > 1:
        heads.append(f"{second}/{first}")
    print("| " + " | ".join(heads) + " |")
    print("|" + "|".join("---:" for _ in heads) + "|")
    for r in rows:
        cells = [f"{r['n']:,}"] + [ratio(r[x], r["otaku"]) for x in t]
        cells += [ratio(r[x], r[floor]) for floor, _ in floors for x in t]
        if len(t) > 1:
            cells.append(ratio(r[second], r[first]))
        print("| " + " | ".join(cells) + " |")
    print("\n## peak RSS (largest of the runs)\n")
    heads = ["messages", "floor", "+parse", "+orjson", *[f"ctx {x}" for x in t], "otaku 0.8"]
    print("| " + " | ".join(heads) + " |")
    print("|" + "|".join("---:" for _ in heads) + "|")
    for r in rows:
        ms = [r["floor"], r["parse"], r["orjson"], *[r[x] for x in t], r["otaku"]]
        print(f"| {r['n']:,} | " + " | ".join(f"{m.rss:.0f}MB" if m.rss else "-" for m in ms) + " |")
    if args.counters:
        print(f"\n## the {first} build by other counters (same rounds; ratio to cl100k_base's)\n")
        labels = [counter_label(spec) for spec in args.counters]
        heads = ["messages", f"cl100k_base ({first})", *labels, *[f"{x}/cl100k" for x in labels]]
        print("| " + " | ".join(heads) + " |")
        print("|" + "|".join("---:" for _ in heads) + "|")
        for r in rows:
            cells = [f"{r['n']:,}", r[first].cell(), *[r[x].cell() for x in labels]]
            print("| " + " | ".join(cells + [ratio(r[x], r[first]) for x in labels]) + " |")
        notes_of = [f"{r['n']:,} {x}: exit {r[x].code}: {r[x].note}" for r in rows for x in labels if r[x].code]
        for line in notes_of:
            print(f"- {line}")
    if any(r["phases"] for r in rows):
        names = ["start-up", "tokenizer", "read", "template", "assemble", "render", "total"]
        print("\n## where ctx's time goes (one in-process run of phases.py; ms)\n")
        print("| messages | template | " + " | ".join(names) + " | case |")
        print("|---:|---|" + "|".join("---:" for _ in names) + "|---:|")
        for r in rows:
            for template, p in r["phases"].items():
                if isinstance(p, str):
                    print(f"| {r['n']:,} | {template} | {p} |")
                else:
                    cells = " | ".join(f"{p.get(k, '-'):.0f}" for k in names)
                    print(f"| {r['n']:,} | {template} | {cells} | {p.get('case')} |")
    notes = [f"{r['n']:,} ctx {x}: exit {r[x].code}: {r[x].note}" for r in rows for x in t if r[x].note]
    notes += [f"otaku: {s.otaku_note}"] if s.otaku_note else []
    if s.otaku:
        notes.append(
            "otaku 0.8 = its export parser + `assemble_story`, tokens as len/4, no template (otaku_adapter.py)"
        )
    notes.append("yardstick = a fixed 3M-step Python loop timed in the same rounds: the machine's speed then")
    if notes:
        print("\nnotes:")
        for line in notes:
            print(f"- {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="*", help=f"story sizes in messages (default {SIZES})")
    parser.add_argument("--repeats", type=int, help="runs per figure, the median reported (default 11)")
    parser.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES} and 3 runs")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"once, small: sizes {SMOKE_SIZES}, 1 run, --startup, --counters estimate; exit 1 on any failure",
    )
    parser.add_argument("--templates", nargs="+", default=TEMPLATES)
    parser.add_argument("--python", default=sys.executable, help="interpreter for ctx and the floor")
    parser.add_argument("--repo", type=Path, default=HERE.parent, help="checkout put on PYTHONPATH")
    parser.add_argument("--ctx", help='a ctx command to run instead, e.g. "/work/venv/bin/ctx"')
    parser.add_argument("--tokenizer", help="passed to ctx (default: ctx's own, cl100k_base)")
    parser.add_argument(
        "--counters",
        nargs="*",
        default=[],
        metavar="SPEC",
        help="also time the first template with each of these --tokenizer values (a GGUF, a tokenizer.json, ...)",
    )
    parser.add_argument("--window", type=int, default=8192)
    parser.add_argument("--head", type=int, default=20)
    parser.add_argument("--tail", type=int, default=150)
    parser.add_argument("--startup", action="store_true", help="also time --version/--help and list imports")
    parser.add_argument("--no-phases", dest="phases", action="store_false", help="skip the phase breakdown")
    parser.add_argument("--no-otaku", action="store_true", help="do not install or run otaku")
    parser.add_argument("--otaku-python", help="an interpreter that already has otaku 0.8.0")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "otaku-ctx-bench",
        help="stories, otaku's venv, scratch files (default ~/.cache/otaku-ctx-bench)",
    )
    parser.add_argument("--slow", type=float, default=10.0, help="a run slower than this is not repeated")
    parser.add_argument("--timeout", type=float, default=300.0, help="stop a ctx or floor run after this")
    parser.add_argument("--otaku-timeout", type=float, default=900.0, help="stop an otaku run after this")
    args = parser.parse_args(argv)
    if args.sizes is None:
        args.sizes = SMOKE_SIZES if args.smoke else QUICK_SIZES if args.quick else SIZES
    if args.repeats is None:
        args.repeats = 1 if args.smoke else 3 if args.quick else 11
    if args.smoke:
        args.startup = True
        args.counters = args.counters or ["estimate"]
    cache = args.cache_dir.expanduser()
    scratch = cache / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    command, env = ctx_setup(args, cache)
    otaku, note = otaku_setup(args, cache) if args.sizes else (None, "")
    s = Setup(command, args.python, env, otaku, note, cache, scratch)
    version = subprocess.run([*command, "--version"], env=env, capture_output=True, text=True).stdout.strip()
    print(f"# {version or 'ctx ?'} ({' '.join(command[:2])} …, PYTHONPATH={args.repo})")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; cache {cache}")
    print(f"window {args.window}, head {args.head}, tail {args.tail}, tokenizer {args.tokenizer or 'ctx default'}")
    if args.startup:
        startup(s, args)
    if args.sizes:
        sizes(s, args)
    if args.smoke:
        if note and not args.no_otaku:
            s.problems.append(f"otaku: {note}")
        for line in s.problems:
            print(f"bench.py --smoke: {line}", file=sys.stderr)
        return 1 if s.problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
