#!/bin/sh
# Install `ctx` into its own virtual environment and put it on PATH.
#
#   sh install.sh                 # venv in ~/.otaku/venv, link in ~/.local/bin
#   PYTHON=python3.12 sh install.sh
#   CTX_BIN_DIR=/usr/local/bin sh install.sh
#   CTX_EXTRAS= sh install.sh       # without the extras installed by default: model (what exact
#                                 # counting with --use needs: tokenizers, jinja2, sentencepiece)
#                                 # and serve (aiohttp, for ctx serve)
#
# Packages come from PyPI; nothing else is downloaded, then or at run time.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
home=${OTAKU_HOME:-$HOME/.otaku}
venv="$home/venv"
bindir=${CTX_BIN_DIR:-$HOME/.local/bin}
python=${PYTHON:-python3}
extras=${CTX_EXTRAS-model,serve}
target=$here
[ -z "$extras" ] || target="$here[$extras]"

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "install.sh: ctx needs Python 3.11 or newer; set PYTHON=/path/to/python3.11" >&2
    exit 1
fi

echo "installing ctx into $venv" >&2
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --use-pep517 "$target"
mkdir -p "$bindir"
ln -sf "$venv/bin/ctx" "$bindir/ctx"

case ":$PATH:" in
    *":$bindir:"*) ;;
    *)
        line="export PATH=\"$bindir:\$PATH\"  # added by otaku-ctx install.sh"
        for rc in "$HOME/.profile" "$HOME/.bashrc" "$HOME/.zshrc"; do
            case "$rc" in
                */.profile) ;;                     # always: login shells read it
                *) [ -f "$rc" ] || continue ;;     # others only if the user has them
            esac
            grep -qs "added by otaku-ctx install.sh" "$rc" || printf '\n%s\n' "$line" >> "$rc"
        done
        echo "added $bindir to PATH in your shell profile: open a new shell to use 'ctx'" >&2
        ;;
esac
echo "ctx is installed: $bindir/ctx" >&2
