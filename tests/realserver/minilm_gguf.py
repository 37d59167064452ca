"""Convert all-MiniLM-L6-v2 (a Hugging Face BERT folder) to an f16 GGUF, without torch.

    PYTHONPATH=<llama.cpp>/gguf-py python minilm_gguf.py MODEL_DIR OUT.gguf

The real-server tests need an embedding model that llama-server serves through /v1/embeddings.
llama.cpp's own converter, convert_hf_to_gguf.py, needs torch and transformers; this script does
what it does for this one model with numpy and llama.cpp's gguf-py alone, and writes the same bytes
as `convert_hf_to_gguf.py --outtype f16 MODEL_DIR` (checked by sha256 in setup.sh).

It mirrors convert_hf_to_gguf.py as vendored in the llama-cpp-python 0.3.36 sdist (llama.cpp
1652066e0af4), whose gguf-py it imports: the sdist's vendor/llama.cpp/gguf-py, the very version
the converter uses (the `gguf` release on PyPI, though also numbered 0.19.0, is older and writes
a different GGUF: its SpecialVocab lacks the tokenizer.ggml.normalizer.lowercase key). From that
sdist's vendor/llama.cpp/conversion/:
  - bert.py, BertModel: filter_tensors, set_gguf_parameters, set_vocab (the phantom-space rewrite);
  - base.py, ModelBase/TextModel: index_tensors (tensors in name order), prepare_tensors (which
    tensors stay f32), prepare_metadata (general.*), set_gguf_parameters (the hyperparameters
    that this config.json has), get_vocab_base (token types), _try_set_pooling_type.
Only what this model needs is kept; anything else (other dtypes, added tokens that are not
special, sharded weights) stops the script instead of being guessed at.
"""

from __future__ import annotations

import json
import logging
import struct
import sys
from pathlib import Path

import gguf
import numpy as np

ARCH = gguf.MODEL_ARCH.BERT
# convert_hf_to_gguf.py names the pre-tokenizer by hashing the HF tokenizer's output on a test
# text (get_vocab_base_pre, which needs transformers). An uncased BERT WordPiece vocabulary hashes
# to 0876d13b50744004..., listed for both "bert-bge" and "jina-v2-en"; the later one wins. llama.cpp
# reads tokenizer.ggml.pre for BPE vocabularies only, not for WordPiece ("bert").
TOKENIZER_PRE = "jina-v2-en"
SAFETENSORS_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2")}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a .safetensors file, by name: an 8-byte little-endian header length, a JSON
    header (name -> dtype, shape, data_offsets), then the raw little-endian data."""
    raw = path.read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_len])
    data = memoryview(raw)[8 + header_len :]
    tensors = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        if meta["dtype"] not in SAFETENSORS_DTYPES:  # e.g. embeddings.position_ids (I64): dropped later
            tensors[name] = None
            continue
        tensors[name] = np.frombuffer(data[start:end], SAFETENSORS_DTYPES[meta["dtype"]]).reshape(meta["shape"])
    return tensors


def hf_name(name: str) -> str | None:
    """BertModel.filter_tensors: the HF name to map, or None for a tensor the GGUF leaves out."""
    name = name.removeprefix("bert.")
    if name.endswith(".gamma"):
        name = name[:-6] + ".weight"
    if name.endswith(".beta"):
        name = name[:-5] + ".bias"
    # only embeddings are computed: no pooler, no masked-LM or next-sentence heads
    if name in ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"):
        return None
    if name.startswith(("cls.predictions", "cls.seq_relationship")):
        return None
    return name


def add_tensors(writer: gguf.GGUFWriter, model_dir: Path, block_count: int) -> None:
    """ModelBase.index_tensors + prepare_tensors for --outtype f16: name order (as safetensors
    lists them), gguf's names, f32 for 1-d tensors, norms, biases, position and token-type
    embeddings, f16 for the other matrices."""
    if not (model_dir / "model.safetensors").is_file() or (model_dir / "model.safetensors.index.json").exists():
        raise SystemExit(f"{model_dir}: expected one model.safetensors")
    tensor_map = gguf.get_tensor_name_map(ARCH, block_count)
    embeddings_f32 = [gguf.MODEL_TENSOR.POS_EMBD, gguf.MODEL_TENSOR.TOKEN_TYPES]
    always_f32 = {gguf.TENSOR_NAMES[key] + ".weight" for key in embeddings_f32}
    for name, data in sorted(read_safetensors(model_dir / "model.safetensors").items()):
        if (name := hf_name(name)) is None:
            continue
        if name.endswith((".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")):
            continue
        if data is None:
            raise SystemExit(f"{name}: unsupported dtype")
        new_name = tensor_map.get_name(key=name, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            raise SystemExit(f"can not map tensor {name!r}")
        f32 = data.ndim <= 1 or new_name.endswith("_norm.weight") or not new_name.endswith(".weight")
        qtype = gguf.GGMLQuantizationType.F32 if f32 or new_name in always_f32 else gguf.GGMLQuantizationType.F16
        writer.add_tensor(new_name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)


def add_metadata(writer: gguf.GGUFWriter, model_dir: Path) -> None:
    """ModelBase.prepare_metadata: general.* from the model card and config.json."""
    total_params, shared_params, expert_params, expert_count = writer.get_total_parameter_count()
    metadata = gguf.Metadata.load(None, model_dir, None, total_params)
    if metadata.name is None:
        metadata.name = model_dir.name
    if metadata.size_label is None and total_params > 0:
        metadata.size_label = gguf.size_label(total_params, shared_params, expert_params, expert_count)
    writer.add_type(gguf.GGUFType.MODEL)
    metadata.set_gguf_meta_model(writer)


def add_hyperparameters(writer: gguf.GGUFWriter, hparams: dict, model_dir: Path) -> None:
    """TextModel.set_gguf_parameters (the keys a BERT config.json has), BertModel's additions
    (non-causal attention, the sentence-transformers pooling), then the quantization version."""
    writer.add_block_count(hparams["num_hidden_layers"])
    writer.add_context_length(hparams["max_position_embeddings"])
    writer.add_embedding_length(hparams["hidden_size"])
    writer.add_feed_forward_length(hparams["intermediate_size"])
    writer.add_head_count(hparams["num_attention_heads"])
    writer.add_layer_norm_eps(hparams["layer_norm_eps"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_causal_attention(False)
    # _try_set_pooling_type: the Pooling module named in modules.json
    modules = json.loads((model_dir / "modules.json").read_text(encoding="utf-8"))
    pooling_path = next(mod["path"] for mod in modules if mod["type"].endswith("Pooling"))
    pooling = json.loads((model_dir / pooling_path / "config.json").read_text(encoding="utf-8"))
    if pooling.get("pooling_mode_mean_tokens"):
        writer.add_pooling_type(gguf.PoolingType.MEAN)
    elif pooling.get("pooling_mode_cls_token"):
        writer.add_pooling_type(gguf.PoolingType.CLS)
    else:
        raise SystemExit(f"{pooling_path}: only mean and CLS pooling are handled")
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def add_vocab(writer: gguf.GGUFWriter, hparams: dict, model_dir: Path) -> None:
    """BertModel.set_vocab: the WordPiece vocabulary by id (TextModel.get_vocab_base), token
    types, the phantom-space rewrite, then the special tokens and flags (gguf.SpecialVocab)."""
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    if tokenizer["model"]["type"] != "WordPiece":
        raise SystemExit("tokenizer.json: not a WordPiece tokenizer")
    vocab = dict(tokenizer["model"]["vocab"])  # token -> id
    added = {tok["content"]: tok for tok in tokenizer["added_tokens"]}
    vocab.update((content, tok["id"]) for content, tok in added.items())
    vocab_size = hparams.get("vocab_size", len(vocab))
    assert max(vocab.values()) < vocab_size
    reverse_vocab = {id_: token for token, id_ in vocab.items()}

    tokens: list[str] = []
    toktypes: list[int] = []
    for i in range(vocab_size):
        token = reverse_vocab.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            toktypes.append(gguf.TokenType.UNUSED)
        elif token in added:
            # get_vocab_base re-normalizes added tokens and marks the special ones CONTROL; BERT's
            # are all special ([PAD], [UNK], [CLS], [SEP], [MASK]) and come back unchanged.
            if not added[token]["special"]:
                raise SystemExit(f"added token {token!r} is not special: not handled")
            tokens.append(token)
            toktypes.append(gguf.TokenType.CONTROL)
        else:
            tokens.append(token)
            toktypes.append(gguf.TokenType.NORMAL)

    # token_type_embeddings' size ("Sequence A" or "Sequence B"); llama.cpp passes all zeros
    writer.add_token_type_count(hparams.get("type_vocab_size", 1))

    # the phantom-space vocabulary llama.cpp's WordPiece tokenizer expects: a word-initial piece
    # gets U+2581 in front, a continuation loses its "##", control tokens stay as they are
    def phantom(token: str, toktype: int) -> str:
        if toktype == gguf.TokenType.CONTROL:
            return token
        if token.startswith("##"):
            return token[2:]
        return "\u2581" + token

    tokens = list(map(phantom, tokens, toktypes))
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre(TOKENIZER_PRE)
    writer.add_token_list(tokens)
    writer.add_token_types(toktypes)
    # bos/eos/unk/sep/pad/mask ids, add_bos/add_eos/add_sep from tokenizer.json's post-processor,
    # the normalizer's lowercase flag: read from tokenizer.json and tokenizer_config.json
    # (gguf-py has no key for cls, BERT's [CLS] being its bos: SpecialVocab warns that it skips it)
    logging.getLogger("gguf.vocab").setLevel(logging.ERROR)
    gguf.SpecialVocab(model_dir, n_vocab=len(tokens)).add_to_gguf(writer, quiet=True)


def convert(model_dir: Path, out: Path) -> None:
    """ModelBase.write: tensors, then metadata, hyperparameters and vocabulary, then the file."""
    hparams = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    if hparams.get("architectures") != ["BertModel"] or hparams.get("model_type") != "bert":
        raise SystemExit(f"{model_dir}: not a BertModel")
    if hparams.get("position_embedding_type", "absolute") != "absolute":
        raise SystemExit(f"{model_dir}: only absolute position embeddings are handled")
    writer = gguf.GGUFWriter(path=None, arch=gguf.MODEL_ARCH_NAMES[ARCH])
    add_tensors(writer, model_dir, hparams["num_hidden_layers"])
    add_metadata(writer, model_dir)
    add_hyperparameters(writer, hparams, model_dir)
    add_vocab(writer, hparams, model_dir)
    writer.write_header_to_file(path=out)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(f"usage: {sys.argv[0]} MODEL_DIR OUT.gguf")
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
