"""BERT's uncased WordPiece tokenizer, read from a Hugging Face `tokenizer.json`.

`WordPiece` reproduces what `tokenizers`' `BertNormalizer` (clean text, spaces around CJK
characters, lowercase, strip accents), `BertPreTokenizer` (split on whitespace and
punctuation) and `WordPiece` model (greedy longest match, `##` continuation) do for
`all-MiniLM-L6-v2`, in pure Python, so the embedder needs no `tokenizers` package.

>>> wp = WordPiece({"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "[PAD]": 3, "un": 4, "##afford": 5, "##able": 6, ",": 7})
>>> wp.encode("Unaffordable, ok", max_len=16)
[1, 4, 5, 6, 7, 0, 2]
"""

from __future__ import annotations

import json
import unicodedata
from typing import Mapping

__all__ = ["WordPiece"]

_MAX_WORD_CHARS = 100


def _is_punct(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (
        0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F
    )


def _normalize(text: str) -> str:
    """Clean (drop control characters, whitespace to spaces), space CJK, lowercase, strip accents."""
    out: list[str] = []
    for ch in text:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or (unicodedata.category(ch) in ("Cc", "Cf") and ch not in "\t\n\r"):
            continue
        if ch.isspace():
            out.append(" ")
        elif _is_cjk(cp):
            out.append(f" {ch} ")
        else:
            out.append(ch)
    lowered = unicodedata.normalize("NFD", "".join(out).lower())
    return "".join(ch for ch in lowered if unicodedata.category(ch) != "Mn")


def _pre_tokenize(text: str) -> list[str]:
    """Split on whitespace, and around every punctuation character."""
    words: list[str] = []
    for chunk in text.split():
        cur = ""
        for ch in chunk:
            if _is_punct(ch):
                if cur:
                    words.append(cur)
                    cur = ""
                words.append(ch)
            else:
                cur += ch
        if cur:
            words.append(cur)
    return words


class WordPiece:
    """An uncased BERT WordPiece tokenizer over `vocab` (token → id).

    Args:
        vocab: the vocabulary; it must hold `[UNK]`, `[CLS]`, `[SEP]` and `[PAD]`.
    """

    def __init__(self, vocab: Mapping[str, int]) -> None:
        self.vocab = dict(vocab)
        self.unk, self.cls, self.sep, self.pad = (self.vocab[t] for t in ("[UNK]", "[CLS]", "[SEP]", "[PAD]"))

    @classmethod
    def from_json(cls, data: bytes | str) -> WordPiece:
        """The tokenizer of a Hugging Face `tokenizer.json` (a WordPiece model)."""
        spec = json.loads(data)
        return cls(spec["model"]["vocab"])

    def _word(self, word: str) -> list[int]:
        if len(word) > _MAX_WORD_CHARS:
            return [self.unk]
        ids: list[int] = []
        start = 0
        while start < len(word):
            end = len(word)
            piece = None
            while start < end:
                sub = word[start:end] if start == 0 else "##" + word[start:end]
                if sub in self.vocab:
                    piece = self.vocab[sub]
                    break
                end -= 1
            if piece is None:
                return [self.unk]
            ids.append(piece)
            start = end
        return ids

    def encode(self, text: str, *, max_len: int) -> list[int]:
        """Token ids of `text` between `[CLS]` and `[SEP]`, cut to `max_len` ids in all."""
        ids = [self.cls]
        for word in _pre_tokenize(_normalize(text)):
            ids.extend(self._word(word))
            if len(ids) >= max_len - 1:
                break
        return ids[: max_len - 1] + [self.sep]
