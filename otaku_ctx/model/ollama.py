"""An Ollama model name resolved, through Ollama's own manifests, to the GGUF blob it serves.

As ollama's source has it (types/model/name.go, manifest/paths.go, server/images.go): a name
is `[host/][namespace/]model[:tag]`, the tag cut at the last `:` after the last `/`, the
defaults `registry.ollama.ai`, `library` and `latest`; each part is checked as Ollama checks
it (a letter, digit or `_` first, then those and `-`, `.` but in a namespace, `:` only in a
host; at most 80 characters, a host 350), so no name reaches outside the models folder. The
manifest is `<models>/manifests/<host>/<namespace>/<model>/<tag>` (JSON, an OCI image
manifest); its layer of media type `application/vnd.ollama.image.model` (the last one, as
Ollama takes it) names the blob `<models>/blobs/sha256-<hex>`. The folder is `$OLLAMA_MODELS`
or `~/.ollama/models` (`locations.ollama_models`).
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

from ..errors import ConfigError, InputError
from ..files import read_input, what_it_is
from ..locations import ollama_models

HOST, NAMESPACE, TAG = "registry.ollama.ai", "library", "latest"
MODEL_LAYER = "application/vnd.ollama.image.model"
#: the most bytes of a manifest read: a real one is under a kilobyte
MANIFEST_BOUND = 1 << 20
_DIGEST = re.compile(r"sha256[:-]([0-9a-fA-F]{64})")
_PART = {
    "host": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,349}"),
    "namespace": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,79}"),
    "model": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}"),
    "tag": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}"),
}
SHOWN = 5  # the models an error lists


def parse_name(name: str) -> tuple[str, str, str, str]:
    """(host, namespace, model, tag) of an Ollama model name, the defaults filled in; a name
    Ollama would not take is a ConfigError."""
    rest, tag = name.strip(), TAG
    rest = rest.split("://", 1)[-1]  # a scheme before the host (https://) names no folder
    if rest.rfind(":") > rest.rfind("/"):
        rest, tag = rest.rsplit(":", 1)
    parts = rest.split("/")
    if len(parts) > 3 or not parts[-1]:
        raise ConfigError(name, None, "not an Ollama model name: expected [host/][namespace/]model[:tag]")
    host = parts[-3] if len(parts) == 3 else HOST
    namespace = parts[-2] if len(parts) >= 2 else NAMESPACE
    found = {"host": host, "namespace": namespace, "model": parts[-1], "tag": tag}
    for kind, part in found.items():
        if not _PART[kind].fullmatch(part):
            raise ConfigError(name, None, f"not an Ollama model name: its {kind} {part!r} is not one Ollama takes")
    return host, namespace, parts[-1], tag


def ollama_model(name: str) -> Path:
    """The GGUF blob Ollama serves for the model `name` (`llama3.1`, `llama3.1:8b`,
    `hf.co/user/repo:Q4_K_M`, `registry/namespace/model:tag`)."""
    parts = parse_name(name)
    root = ollama_models()
    manifests = root / "manifests"
    if not manifests.is_dir():
        raise ConfigError(
            name, None, f"no Ollama models in {root} (is Ollama installed? set OLLAMA_MODELS to its models folder)"
        )
    manifest = _find(manifests, parts)
    if manifest is None:
        have = _listed(manifests)
        listed = f"; it has {', '.join(have)}" if have else "; it has none (ollama pull one)"
        raise ConfigError(name, None, f"no such Ollama model in {root}{listed}")
    return _blob(name, root, manifest)


def _find(manifests: Path, parts: tuple[str, ...]) -> Path | None:
    """The manifest file of the name: each folder matched as written, else regardless of
    case (Ollama compares names so). The parts were checked: none is `..` or holds a `/`."""
    here = manifests
    for part in parts:
        exact = here / part
        if exact.exists():
            here = exact
            continue
        try:
            near = [entry for entry in here.iterdir() if entry.name.casefold() == part.casefold()]
        except OSError:
            return None
        if not near:
            return None
        here = near[0]
    return None if here.is_dir() else here  # a file; or one that is not, which `_blob` names


def _listed(manifests: Path) -> list[str]:
    """A few of the models there, as `ollama list` shows them (the default host and
    namespace left out)."""
    shown: list[str] = []
    try:
        for tag in sorted(manifests.glob("*/*/*/*")):
            host, namespace, model = tag.parts[-4:-1]
            prefix = "" if host == HOST else f"{host}/"
            prefix += "" if host == HOST and namespace == NAMESPACE else f"{namespace}/"
            shown.append(f"{prefix}{model}:{tag.name}")
            if len(shown) > SHOWN:
                break
    except OSError:
        return shown
    return shown[:SHOWN] + (["…"] if len(shown) > SHOWN else [])


def _not_regular(path: Path, what: str, name: str) -> None:
    """A manifest or a blob that is there but no regular file (a device, a FIFO, a socket)
    says so, rather than passing for a model that is missing."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # a symlink to nothing, say: its reader names it
        return
    if not stat.S_ISREG(mode):
        raise InputError(
            path, f"is {what_it_is(mode) or 'a FIFO'}, not {what}; pull the model again (ollama pull {name})"
        )


def _blob(name: str, root: Path, manifest: Path) -> Path:
    _not_regular(manifest, "an Ollama manifest", name)
    data = read_input(manifest, "model manifest", MANIFEST_BOUND)
    try:
        parsed = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise InputError(manifest, "not an Ollama manifest (not JSON); pull the model again (ollama pull)") from None
    layers = parsed.get("layers") if isinstance(parsed, dict) else None
    if not isinstance(layers, list):
        raise InputError(manifest, "not an Ollama manifest (no layers); pull the model again (ollama pull)")
    models = [layer for layer in layers if isinstance(layer, dict) and layer.get("mediaType") == MODEL_LAYER]
    if not models:
        raise ConfigError(name, None, f"its manifest {manifest} has no model layer (not a GGUF model ctx can read)")
    digest = models[-1].get("digest")
    found = _DIGEST.fullmatch(digest) if isinstance(digest, str) else None
    if found is None:
        raise InputError(manifest, f"its model layer's digest {str(digest)[:80]!r} is not a sha256 digest")
    blob = root / "blobs" / f"sha256-{found.group(1)}"
    if not blob.exists():
        raise ConfigError(name, None, f"its model blob {blob} is missing; pull the model again (ollama pull {name})")
    _not_regular(blob, "a model blob (a GGUF file)", name)
    return blob
