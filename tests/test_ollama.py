"""Ollama model names resolved through a models folder the tests make (manifests as Ollama
writes them, blobs of a few bytes), hostile names and manifests included."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from conftest import CASE3
from ctx_run import ctx, one_line

from otaku_ctx.errors import ConfigError, InputError, OtakuError
from otaku_ctx.locations import ollama_models
from otaku_ctx.model.ollama import MODEL_LAYER, ollama_model, parse_name
from otaku_ctx.status import ExitStatus


def blob(models: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    (models / "blobs").mkdir(parents=True, exist_ok=True)
    (models / "blobs" / f"sha256-{digest}").write_bytes(data)
    return f"sha256:{digest}"


def manifest(models: Path, host: str, namespace: str, model: str, tag: str, layers: list[dict]) -> Path:
    path = models / "manifests" / host / namespace / model / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    config = {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:" + "0" * 64}
    body = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json"}
    path.write_text(json.dumps({**body, "config": config, "layers": layers}))
    return path


def model_layer(models: Path, data: bytes, kind: str = MODEL_LAYER) -> dict:
    return {"mediaType": kind, "digest": blob(models, data), "size": len(data)}


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "ollama-models"
    monkeypatch.setenv("OLLAMA_MODELS", str(folder))
    template = {"mediaType": "application/vnd.ollama.image.template", "digest": blob(folder, b"{{ .Prompt }}")}
    for host, namespace, model, tag, data in [
        ("registry.ollama.ai", "library", "llama3.1", "latest", b"GGUF llama3.1 8b"),
        ("registry.ollama.ai", "library", "llama3.1", "70b", b"GGUF llama3.1 70b"),
        ("hf.co", "bartowski", "SmolLM2-135M-Instruct-GGUF", "Q4_K_M", b"GGUF smol"),
        ("registry.ollama.ai", "mara", "lighthouse", "v2", b"GGUF mara's own"),
        ("localhost:5000", "team", "nemo", "latest", b"GGUF nemo"),
    ]:
        manifest(folder, host, namespace, model, tag, [model_layer(folder, data), template])
    return folder


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("llama3.1", b"GGUF llama3.1 8b"),
        ("llama3.1:latest", b"GGUF llama3.1 8b"),
        ("llama3.1:70b", b"GGUF llama3.1 70b"),
        ("library/llama3.1:70b", b"GGUF llama3.1 70b"),
        ("registry.ollama.ai/library/llama3.1", b"GGUF llama3.1 8b"),
        ("hf.co/bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M", b"GGUF smol"),
        ("hf.co/bartowski/smollm2-135m-instruct-gguf:q4_k_m", b"GGUF smol"),  # Ollama's names ignore case
        ("mara/lighthouse:v2", b"GGUF mara's own"),
        ("localhost:5000/team/nemo", b"GGUF nemo"),
        ("https://localhost:5000/team/nemo:latest", b"GGUF nemo"),
    ],
)
def test_a_name_is_its_model_blob(models: Path, name: str, data: bytes) -> None:
    found = ollama_model(name)
    assert found.read_bytes() == data
    assert found.parent == models / "blobs" and found.name == f"sha256-{hashlib.sha256(data).hexdigest()}"


def test_the_default_folder_is_under_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ollama_models() == tmp_path / ".ollama" / "models"
    monkeypatch.setenv("OLLAMA_MODELS", ' "/srv/ollama" ')  # trimmed as Ollama trims it
    assert ollama_models() == Path("/srv/ollama")


def test_the_last_model_layer_is_the_one(models: Path) -> None:
    layers = [model_layer(models, b"GGUF first"), model_layer(models, b"GGUF adapter base"), model_layer(models, b"x")]
    layers[2]["mediaType"] = "application/vnd.ollama.image.projector"
    manifest(models, "registry.ollama.ai", "library", "split", "latest", layers)
    assert ollama_model("split").read_bytes() == b"GGUF adapter base"


@pytest.mark.parametrize(
    "name",
    ["../../etc", "llama3.1:../../etc", "llama3.1:..", "../llama3.1", "a/b/c/d", "llama3.1:", "", "-x", "na.me/model"],
)
def test_a_name_that_is_not_ollama_s_reaches_no_file(models: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="not an Ollama model name") as error:
        ollama_model(name)
    assert "\n" not in str(error.value)


def test_no_such_model_lists_some_that_are(models: Path) -> None:
    with pytest.raises(ConfigError) as error:
        ollama_model("mistral-nemo")
    message = str(error.value)
    assert message.startswith("mistral-nemo: no such Ollama model in ")
    assert "llama3.1:latest" in message and "hf.co/bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M" in message
    assert "mara/lighthouse:v2" in message and "\n" not in message


def test_no_such_tag(models: Path) -> None:
    with pytest.raises(ConfigError, match="no such Ollama model"):
        ollama_model("llama3.1:405b")


def test_ollama_not_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "nothing"))
    with pytest.raises(ConfigError, match="is Ollama installed"):
        ollama_model("llama3.1")


def test_a_manifest_without_a_model_layer(models: Path) -> None:
    template = {"mediaType": "application/vnd.ollama.image.template", "digest": blob(models, b"t")}
    manifest(models, "registry.ollama.ai", "library", "embedder", "latest", [template])
    with pytest.raises(ConfigError, match="has no model layer"):
        ollama_model("embedder")


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"not json", "not JSON"),
        (b'{"layers": "none"}', "no layers"),
        (b"[1, 2]", "no layers"),
        (json.dumps({"layers": [{"mediaType": MODEL_LAYER, "digest": "sha256:../../etc/passwd"}]}).encode(), "digest"),
        (json.dumps({"layers": [{"mediaType": MODEL_LAYER, "digest": ["x"]}]}).encode(), "digest"),
    ],
)
def test_a_hostile_manifest(models: Path, content: bytes, said: str) -> None:
    path = manifest(models, "registry.ollama.ai", "library", "bad", "latest", [])
    path.write_bytes(content)
    with pytest.raises(InputError, match=said) as error:
        ollama_model("bad")
    assert str(error.value).startswith(str(path)) and "\n" not in str(error.value)


def test_a_huge_manifest_is_not_read(models: Path) -> None:
    path = manifest(models, "registry.ollama.ai", "library", "huge", "latest", [])
    with open(path, "wb") as file:
        file.truncate(64 << 20)  # sparse: 64 MiB that are never read
    with pytest.raises(OtakuError) as error:
        ollama_model("huge")
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_a_missing_blob(models: Path) -> None:
    layer = {"mediaType": MODEL_LAYER, "digest": "sha256:" + "a" * 64}
    manifest(models, "registry.ollama.ai", "library", "gone", "latest", [layer])
    with pytest.raises(ConfigError, match="model blob .* is missing; pull the model again"):
        ollama_model("gone")


def test_a_tag_that_is_a_folder(models: Path) -> None:
    (models / "manifests" / "registry.ollama.ai" / "library" / "odd" / "latest").mkdir(parents=True)
    with pytest.raises(ConfigError, match="no such Ollama model"):
        ollama_model("odd")


@pytest.mark.parametrize(
    ("name", "parts"),
    [
        ("llama3.1", ("registry.ollama.ai", "library", "llama3.1", "latest")),
        ("user/model:tag", ("registry.ollama.ai", "user", "model", "tag")),
        ("hf.co/u/r:Q8_0", ("hf.co", "u", "r", "Q8_0")),
        ("localhost:11434/u/r", ("localhost:11434", "u", "r", "latest")),
    ],
)
def test_names_are_parsed_as_ollama_parses_them(name: str, parts: tuple[str, ...]) -> None:
    assert parse_name(name) == parts


def test_a_manifest_that_is_a_device_says_so(models: Path) -> None:
    """Not "no such Ollama model dz; it has …, dz:latest": what it is, and what to do."""
    path = models / "manifests" / "registry.ollama.ai" / "library" / "dz" / "latest"
    path.parent.mkdir(parents=True)
    path.symlink_to("/dev/zero")
    with pytest.raises(InputError) as error:
        ollama_model("dz")
    assert str(error.value) == (
        f"{path}: is a character device, not an Ollama manifest; pull the model again (ollama pull dz)"
    )


def test_a_blob_that_is_a_device_says_so(models: Path) -> None:
    """Not "is missing; pull it again": what it is."""
    digest = "b" * 64
    layer = {"mediaType": MODEL_LAYER, "digest": f"sha256:{digest}"}
    manifest(models, "registry.ollama.ai", "library", "dz", "latest", [layer])
    path = models / "blobs" / f"sha256-{digest}"
    path.symlink_to("/dev/zero")
    with pytest.raises(InputError) as error:
        ollama_model("dz")
    assert str(error.value) == (
        f"{path}: is a character device, not a model blob (a GGUF file); pull the model again (ollama pull dz)"
    )


def test_a_manifest_that_is_a_symlink_to_nothing_says_so(models: Path) -> None:
    path = models / "manifests" / "registry.ollama.ai" / "library" / "gone" / "latest"
    path.parent.mkdir(parents=True)
    path.symlink_to(models / "nowhere")
    with pytest.raises(ConfigError, match="is a symlink to nothing") as error:
        ollama_model("gone")
    assert str(error.value).startswith(str(path))


# -- #18: an Ollama manifest or blob that is a device ----------------------------------------


@pytest.mark.parametrize("which", ["manifest", "blob"])
def test_an_ollama_manifest_or_blob_that_is_a_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    models = tmp_path / "ollama"
    manifest = models / "manifests" / "registry.ollama.ai" / "library" / "dz" / "latest"
    manifest.parent.mkdir(parents=True)
    blob = models / "blobs" / ("sha256-" + "c" * 64)
    blob.parent.mkdir()
    if which == "manifest":
        manifest.symlink_to("/dev/zero")
    else:
        layer = {"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:" + "c" * 64}
        manifest.write_text(json.dumps({"layers": [layer]}))
        blob.symlink_to("/dev/zero")
    monkeypatch.setenv("OLLAMA_MODELS", str(models))
    code, out, err = ctx("build", CASE3, "--use", "dz")
    shown, what = (manifest, "an Ollama manifest") if which == "manifest" else (blob, "a model blob (a GGUF file)")
    assert (code, out) == (ExitStatus.ERROR, "")
    assert one_line(err) == f"ctx: {shown}: is a character device, not {what}; pull the model again (ollama pull dz)\n"
