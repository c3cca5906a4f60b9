"""The tiny GGUF writer (inferway/devtools/tiny_gguf.py): deterministic bytes, the metadata
llama.cpp reads, a vocabulary whose token counts are known without the engine."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from inferway.devtools.tiny_gguf import (
    CHAT_TEMPLATE,
    TinyLlama,
    count_tokens,
    vocabulary,
    write_tiny_gguf,
)


def test_same_spec_same_bytes_other_seed_other_weights(tmp_path: Path) -> None:
    a = write_tiny_gguf(tmp_path / "a.gguf").read_bytes()
    b = write_tiny_gguf(tmp_path / "sub" / "b.gguf").read_bytes()
    c = write_tiny_gguf(tmp_path / "c.gguf", TinyLlama(seed=1)).read_bytes()
    assert a == b
    assert len(a) == len(c) and a != c
    assert len(a) < 1 << 20


def test_metadata_and_tensors_read_back(tmp_path: Path) -> None:
    spec = TinyLlama(context_length=8192)
    reader = gguf.GGUFReader(write_tiny_gguf(tmp_path / "m.gguf", spec))

    def value(key: str) -> object:
        return reader.fields[key].contents()

    assert value("general.architecture") == "llama"
    assert value("llama.context_length") == 8192
    assert value("llama.embedding_length") == spec.n_embd
    assert value("llama.block_count") == spec.n_layer
    assert value("llama.attention.head_count_kv") == spec.n_head_kv
    assert value("tokenizer.ggml.model") == "llama"
    assert value("tokenizer.chat_template") == CHAT_TEMPLATE
    assert value("tokenizer.ggml.tokens") == [text for text, _, _ in vocabulary()]
    shapes = {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}
    # GGUF lists dimensions innermost first: (n_embd, n_vocab) for a (vocab, embd) matrix
    assert shapes["token_embd.weight"] == (spec.n_embd, len(vocabulary()))
    assert shapes["blk.1.ffn_down.weight"] == (spec.n_ff, spec.n_embd)
    assert len(shapes) == 3 + 9 * spec.n_layer  # embeddings, output norm, output; 9 per layer
    output = next(t for t in reader.tensors if t.name == "output.weight").data
    allowed = np.asarray(output)[3 + 256 :]
    assert (np.asarray(output)[: 3 + 256, 0] < 0).all() and (allowed[:, 0] == 0).all()


def test_vocabulary_layout() -> None:
    tokens = vocabulary()
    texts = [text for text, _, _ in tokens]
    assert texts[:3] == ["<unk>", "<s>", "</s>"]
    assert texts[3] == "<0x00>" and texts[3 + 255] == "<0xFF>"
    assert texts[3 + 256] == "\u2581"
    assert len(set(texts)) == len(texts) == 3 + 256 + 1 + 94


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("", 1),  # BOS only
        ("a", 3),  # BOS, the space prefix, a
        ("a b", 5),
        ("é", 4),  # two UTF-8 bytes, two byte tokens
        ("\n", 3),
        ("✓", 5),  # three bytes
    ],
)
def test_count_tokens(text: str, count: int) -> None:
    assert count_tokens(text) == count
    assert count_tokens(text, add_bos=False) == count - 1


def test_spec_is_checked() -> None:
    with pytest.raises(ValueError, match="n_embd"):
        TinyLlama(n_embd=60, n_head=8)
    with pytest.raises(ValueError, match="positive"):
        TinyLlama(context_length=0)
