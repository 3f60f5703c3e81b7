"""Writes tiny_llm's tokenizer (model_repository/tiny_llm/tokenizer.json): byte level, built
locally with the ``tokenizers`` library: token i (0-255) is byte i, then ``<bos>`` (256),
which starts every encoded text, and ``<eos>`` (257). Deterministic: the committed file is
this tool's output.

    python -m tools.tinyllm_tokenizer [PATH]
"""

from __future__ import annotations

import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

BOS, EOS = "<bos>", "<eos>"
DEFAULT_PATH = Path(__file__).resolve().parent.parent / "model_repository/tiny_llm/tokenizer.json"


def _byte_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte (what the ByteLevel pre-tokenizer emits)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in kept:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def build() -> Tokenizer:
    vocab = {c: i for i, c in enumerate(_byte_chars())}
    vocab[BOS], vocab[EOS] = 256, 257
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([BOS, EOS])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, 256)]
    )
    return tok


def main(argv: list[str]) -> None:
    path = Path(argv[0]) if argv else DEFAULT_PATH
    build().save(str(path), pretty=False)
    print(path)


if __name__ == "__main__":
    main(sys.argv[1:])
