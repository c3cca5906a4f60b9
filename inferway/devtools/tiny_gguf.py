"""A tiny random-weight llama model written as GGUF, for tests that need a real LLM engine
(llama.cpp) without downloading one: the same bytes for the same arguments, written in
milliseconds, loaded by llama.cpp in well under a second and fast enough on one CPU core.

The model is a 2-layer llama (embedding 64, 4 heads, feed-forward 128) with a
character-level SentencePiece ("llama") vocabulary: ``<unk> <s> </s>``, the 256 byte
tokens ``<0x00>``..``<0xFF>`` (llama.cpp's byte fallback for anything else), ``▁`` (a space)
and the 94 printable ASCII characters. So a prompt's token count is known without the engine
(:func:`count_tokens`): the gateway's counts and a 1 MB body's integrity can be checked
against it.

Its output layer is built so that generation only ever yields space and printable ASCII
tokens: never ``</s>`` (a completion always runs to ``max_tokens``, so ``usage`` is exactly
predictable) and never a lone byte token (no invalid UTF-8 in a stream). Dimension 0 of the
residual stream holds a constant (every embedding has it, no layer writes to it), and the
output rows of the forbidden tokens weigh only that dimension, negatively: their logits are
about -80 whatever the prompt.

``python -m inferway.devtools.tiny_gguf --out tiny.gguf`` writes one (docs/llm.md).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "CHAT_TEMPLATE",
    "TinyLlama",
    "count_tokens",
    "vocabulary",
    "write_tiny_gguf",
]

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
"""A minimal chat template (jinja, as llama.cpp and llama-cpp-python render it): each message
as ``<|role|>content`` and a newline, then ``<|assistant|>``."""

_SPACE = "\u2581"  # SentencePiece's visible space, which llama.cpp maps " " to
_PRINTABLE = tuple(chr(c) for c in range(0x21, 0x7F))

# GGUF token types (gguf.TokenType), spelled out so the vocabulary needs no gguf import
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6
_BOS_ID, _EOS_ID, _UNK_ID = 1, 2, 0
_FIRST_TEXT_ID = 3 + 256  # after the specials and the byte tokens

_BIAS = 4.0  # the constant of residual dimension 0
_FORBID = -40.0  # the forbidden tokens' output weight on it


def vocabulary() -> list[tuple[str, float, int]]:
    """The tokens as (text, score, GGUF token type), in id order."""
    tokens = [("<unk>", 0.0, _UNKNOWN), ("<s>", 0.0, _CONTROL), ("</s>", 0.0, _CONTROL)]
    tokens += [(f"<0x{b:02X}>", 0.0, _BYTE) for b in range(256)]
    tokens += [(piece, 0.0, _NORMAL) for piece in (_SPACE, *_PRINTABLE)]
    return tokens


def count_tokens(text: str, *, add_bos: bool = True) -> int:
    """How many tokens llama.cpp makes of ``text`` with this vocabulary (no special tokens in
    ``text``): the BOS, a leading ``▁`` (SentencePiece's space prefix), one token per space or
    printable ASCII character, and one byte token per UTF-8 byte of anything else."""
    count = 1 if add_bos else 0
    if not text:
        return count
    count += 1  # the space prefix
    for char in text:
        count += 1 if char == " " or char in _PRINTABLE else len(char.encode("utf-8"))
    return count


@dataclass(frozen=True)
class TinyLlama:
    """The shape of the model; every field is written into the GGUF metadata."""

    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 4
    n_ff: int = 128
    context_length: int = 32768
    """The training context llama.cpp reads (``llama.context_length``): the most a server's
    ``n_ctx`` should ask for without a warning."""
    seed: int = 0
    name: str = "inferway-tiny-llama"

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head or self.n_head % self.n_head_kv:
            raise ValueError(
                f"TinyLlama: n_embd ({self.n_embd}) must divide by n_head ({self.n_head}) and "
                f"n_head by n_head_kv ({self.n_head_kv})"
            )
        if min(self.n_layer, self.n_embd, self.n_ff, self.context_length) < 1:
            raise ValueError(f"TinyLlama: sizes must be positive: {self}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def _tensors(spec: TinyLlama, n_vocab: int) -> dict[str, np.ndarray]:
    """The weights, numpy shape (rows = output, cols = input) as GGUF stores them."""
    rng = np.random.default_rng(spec.seed)
    d, kv = spec.n_embd, spec.head_dim * spec.n_head_kv

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def into_residual(shape: tuple[int, ...], std: float) -> np.ndarray:
        # a matrix whose output is added to the residual stream leaves dimension 0 alone
        weights = normal(shape, std)
        weights[0, :] = 0.0
        return weights

    embeddings = normal((n_vocab, d), 1.0)
    embeddings[:, 0] = _BIAS
    tensors = {"token_embd.weight": embeddings}
    for i in range(spec.n_layer):
        blk = f"blk.{i}"
        tensors |= {
            f"{blk}.attn_norm.weight": np.ones(d, np.float32),
            f"{blk}.attn_q.weight": normal((d, d), d**-0.5),
            f"{blk}.attn_k.weight": normal((kv, d), d**-0.5),
            f"{blk}.attn_v.weight": normal((kv, d), d**-0.5),
            f"{blk}.attn_output.weight": into_residual((d, d), d**-0.5),
            f"{blk}.ffn_norm.weight": np.ones(d, np.float32),
            f"{blk}.ffn_gate.weight": normal((spec.n_ff, d), d**-0.5),
            f"{blk}.ffn_up.weight": normal((spec.n_ff, d), d**-0.5),
            f"{blk}.ffn_down.weight": into_residual((d, spec.n_ff), spec.n_ff**-0.5),
        }
    output = normal((n_vocab, d), 0.5)
    output[:, 0] = 0.0
    output[:_FIRST_TEXT_ID, :] = 0.0
    output[:_FIRST_TEXT_ID, 0] = _FORBID
    tensors["output_norm.weight"] = np.ones(d, np.float32)
    tensors["output.weight"] = output
    return tensors


def write_tiny_gguf(path: str | Path, spec: TinyLlama | None = None) -> Path:
    """Write the model to ``path`` (parents created) and return the path; the same ``spec``
    always gives the same bytes."""
    import gguf  # the llm-engine extra; imported here so the rest of devtools does without it

    spec = spec or TinyLlama()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens = vocabulary()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(spec.name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(spec.context_length)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layer)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_rope_dimension_count(spec.head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("llama")
    writer.add_token_list([text for text, _, _ in tokens])
    writer.add_token_scores([score for _, score, _ in tokens])
    writer.add_token_types([kind for _, _, kind in tokens])
    writer.add_bos_token_id(_BOS_ID)
    writer.add_eos_token_id(_EOS_ID)
    writer.add_unk_token_id(_UNK_ID)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, array in _tensors(spec, len(tokens)).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write the tiny random-weight llama GGUF.")
    parser.add_argument("--out", type=Path, required=True, help="the .gguf file to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--context-length", type=int, default=TinyLlama.context_length)
    args = parser.parse_args(argv)
    path = write_tiny_gguf(args.out, TinyLlama(seed=args.seed, context_length=args.context_length))
    print(f"{path}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
