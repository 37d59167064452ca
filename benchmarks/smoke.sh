#!/bin/sh
# Every benchmark once at a small size, one after another, so that none rots unseen: each
# benchmark's --smoke runs all it reports over fewer rounds, messages or cases (its docstring
# says which), in seconds, and exits non-zero when something in it breaks. This stops at the
# first that fails. Its figures show that a benchmark works, not how fast ctx is: one round at
# a small size on a shared machine.
#
#   sh benchmarks/smoke.sh     # with the repository's .venv (else python3); PYTHON=… another
#
# The helpers have no --smoke of their own: storygen.py and longstory.py are run here and must
# give back the bundled examples and tests/fixtures/replay-long.jsonl byte for byte;
# otaku_adapter.py (otaku 0.8.0, installed into a venv in ~/.cache/otaku-ctx-bench on first use)
# and phases.py are run by bench.py, whose --smoke fails when either does.
#
# The last steps need the real model server: `sh tests/realserver/setup.sh` builds it once
# (.ci/run does, before this), and `setup.sh --check` prints its paths, as tests/realserver
# reads them. Each step is on its own line: under `set -e` a failure inside an `a && b` list
# before its last command does not stop the script.
set -eu
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$repo/.venv/bin/python" ]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# step COMMAND…: say what runs, run it (a failure ends the script: set -e), say how long it took.
step() {
    echo "== smoke: $*"
    began="$(date +%s%N)"
    "$@"
    echo "== smoke: $(( ($(date +%s%N) - began) / 1000000 )) ms: $*"
}

step "$PYTHON" benchmarks/storygen.py examples "$work/examples"
for name in lighthouse-case3.jsonl lighthouse-case4.jsonl; do
    cmp "$work/examples/$name" "examples/$name" || { echo "examples/$name is not what storygen.py writes" >&2; exit 1; }
done
step "$PYTHON" benchmarks/longstory.py "$work/replay-long.jsonl"
cmp "$work/replay-long.jsonl" tests/fixtures/replay-long.jsonl || { echo "replay-long.jsonl is not what longstory.py writes" >&2; exit 1; }
step "$PYTHON" benchmarks/template_render.py --smoke
step "$PYTHON" benchmarks/bench.py --smoke
step "$PYTHON" benchmarks/warm_build.py --smoke
step "$PYTHON" benchmarks/lore_bench.py --smoke
step "$PYTHON" benchmarks/lore_bench.py --worst --smoke
step "$PYTHON" benchmarks/replay.py --smoke
step "$PYTHON" benchmarks/cache_bound.py --smoke
step "$PYTHON" benchmarks/recall_bench.py --smoke
step "$PYTHON" benchmarks/recall_bench.py --serve --smoke
step "$PYTHON" benchmarks/meaning_cost.py --smoke
step "$PYTHON" benchmarks/model_tokenizers.py --smoke
step "$PYTHON" benchmarks/hostile_bounds.py --smoke
step "$PYTHON" benchmarks/hostile_text.py --smoke
step "$PYTHON" benchmarks/summarize_bench.py --smoke --instant 50

# The real model server's: setup.sh --check fails (naming what is missing) when it is not built.
paths="$(sh tests/realserver/setup.sh --check)"
gguf="$(echo "$paths" | sed -n 's/^SMOLLM2_GGUF=//p')"
[ -f "$gguf" ] || { echo "setup.sh --check printed no SMOLLM2_GGUF" >&2; exit 1; }
step "$PYTHON" benchmarks/model_tokenizers.py --smoke --gguf "$gguf"
step "$PYTHON" benchmarks/summarize_bench.py --smoke
step "$PYTHON" benchmarks/ttft_bench.py --smoke
step "$PYTHON" benchmarks/recall_bench.py --serve --meaning

step "$PYTHON" benchmarks/serve_bench.py --smoke
echo "== smoke: every benchmark ran"
