"""The tiny synthetic GGUF fixtures load and run through llama.cpp's low-level API.

These tests pin what the rest of the unit suite relies on: the tiny models tokenize
any text, honour ChatML/Gemma control tokens as end-of-generation, decode
deterministically, and round-trip a sequence's KV state from one sequence to another.
They also pin two llama.cpp facts the memory layer depends on: the state blob's header
and section layout, and that an iSWA (gemma3) blob carries only the sliding window.
The qwen2 fixture (Qwen2.5's jinja template, no BOS, `<|im_end|>` as EOS) has its own tests at the end.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from tests.fixtures.tiny_gguf import (  # noqa: E402
    BOS_ID,
    CHATML_TEMPLATE,
    END_OF_TURN_ID,
    EOS_ID,
    IM_END_ID,
    IM_START_ID,
    QWEN2_TEMPLATE,
    START_OF_TURN_ID,
    TINY_VOCAB_SIZE,
    build_tiny_gguf,
)

N_SEQ_MAX = 4
N_CTX = 512


@dataclass
class Loaded:
    """A loaded model, its vocabulary and an open context (freed by the fixture)."""

    model: ctypes.c_void_p
    vocab: ctypes.c_void_p
    ctx: ctypes.c_void_p


def _load_model(path: Path) -> ctypes.c_void_p:
    params = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model, f"llama_model_load_from_file failed for {path}"
    return model


def _new_context(model: ctypes.c_void_p) -> ctypes.c_void_p:
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = N_CTX
    params.n_batch = N_CTX
    params.n_ubatch = N_CTX
    params.n_seq_max = N_SEQ_MAX
    params.n_threads = 1
    params.n_threads_batch = 1
    params.kv_unified = True
    params.swa_full = True
    params.flash_attn_type = 1  # LLAMA_FLASH_ATTN_TYPE_ENABLED
    ctx = llama_cpp.llama_init_from_model(model, params)
    assert ctx, "llama_init_from_model failed"
    return ctx


@pytest.fixture(scope="module", autouse=True)
def _backend() -> None:
    llama_cpp.llama_backend_init()


@pytest.fixture(params=["llama", "gemma3"])
def loaded(
    request: pytest.FixtureRequest, tiny_model_path: Path, tiny_gemma3_path: Path
) -> Iterator[Loaded]:
    path = tiny_model_path if request.param == "llama" else tiny_gemma3_path
    model = _load_model(path)
    ctx = _new_context(model)
    try:
        yield Loaded(model=model, vocab=llama_cpp.llama_model_get_vocab(model), ctx=ctx)
    finally:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)


def tokenize(vocab: ctypes.c_void_p, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
    data = text.encode()
    n_max = len(data) + 8
    buf = (llama_cpp.llama_token * n_max)()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, n_max, add_special, parse_special)
    assert n >= 0, f"llama_tokenize needed {-n} tokens, buffer had {n_max}"
    return list(buf[:n])


def detokenize(vocab: ctypes.c_void_p, tokens: list[int]) -> str:
    out = b""
    buf = ctypes.create_string_buffer(64)
    for token in tokens:
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, False)
        assert n >= 0, f"llama_token_to_piece({token}) returned {n}"
        out += buf.raw[:n]
    return out.decode()


def decode(ctx: ctypes.c_void_p, tokens: list[int], *, seq_id: int, pos0: int) -> np.ndarray:
    """Decode ``tokens`` into ``seq_id`` from position ``pos0``; return the last logits."""
    batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
    try:
        for i, token in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = pos0 + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq_id
            batch.logits[i] = i == len(tokens) - 1
        batch.n_tokens = len(tokens)
        rc = llama_cpp.llama_decode(ctx, batch)
        assert rc == 0, f"llama_decode returned {rc}"
    finally:
        llama_cpp.llama_batch_free(batch)
    logits = llama_cpp.llama_get_logits_ith(ctx, -1)
    return np.ctypeslib.as_array(logits, shape=(TINY_VOCAB_SIZE,)).copy()


def get_seq_state(ctx: ctypes.c_void_p, seq_id: int) -> bytes:
    size = llama_cpp.llama_state_seq_get_size(ctx, seq_id)
    buf = (ctypes.c_uint8 * size)()
    written = llama_cpp.llama_state_seq_get_data(ctx, buf, size, seq_id)
    assert written == size, f"{written=}, {size=}"
    return bytes(buf)


def set_seq_state(ctx: ctypes.c_void_p, blob: bytes, seq_id: int) -> None:
    buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
    read = llama_cpp.llama_state_seq_set_data(ctx, buf, len(blob), seq_id)
    assert read == len(blob), f"llama_state_seq_set_data read {read} of {len(blob)} bytes"


CHATML_TEXT = "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"


def test_build_is_byte_for_byte_deterministic(tmp_path: Path) -> None:
    a = build_tiny_gguf(tmp_path / "a.gguf", seed=7).read_bytes()
    b = build_tiny_gguf(tmp_path / "b.gguf", seed=7).read_bytes()
    c = build_tiny_gguf(tmp_path / "c.gguf", seed=8).read_bytes()
    assert a == b
    assert a != c


def test_unknown_arch_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="gemma3"):
        build_tiny_gguf(tmp_path / "x.gguf", arch="mistral")


def test_vocab_and_specials(loaded: Loaded) -> None:
    vocab = loaded.vocab
    assert llama_cpp.llama_vocab_n_tokens(vocab) == TINY_VOCAB_SIZE
    assert llama_cpp.llama_vocab_bos(vocab) == BOS_ID
    assert llama_cpp.llama_vocab_eos(vocab) == EOS_ID
    assert llama_cpp.llama_vocab_eot(vocab) in (IM_END_ID, END_OF_TURN_ID)
    for token in (EOS_ID, IM_END_ID, END_OF_TURN_ID):
        assert llama_cpp.llama_vocab_is_eog(vocab, token), token
    for token in (BOS_ID, IM_START_ID, START_OF_TURN_ID):
        assert not llama_cpp.llama_vocab_is_eog(vocab, token), token


def test_chat_template_metadata(loaded: Loaded, tmp_path: Path) -> None:
    template = llama_cpp.llama_model_chat_template(loaded.model, None)
    assert template is not None and template.decode() == CHATML_TEMPLATE

    bare = _load_model(build_tiny_gguf(tmp_path / "bare.gguf", chat_template=None))
    try:
        assert llama_cpp.llama_model_chat_template(bare, None) is None
    finally:
        llama_cpp.llama_model_free(bare)


def test_tokenize_words_and_byte_fallback(loaded: Loaded) -> None:
    tokens = tokenize(loaded.vocab, "hello world", add_special=True, parse_special=False)
    assert len(tokens) == 3 and tokens[0] == BOS_ID, tokens
    assert detokenize(loaded.vocab, tokens[1:]) == " hello world"

    text = "Tab\there, newline\n~`^$%&é 42!"
    tokens = tokenize(loaded.vocab, text, add_special=False, parse_special=False)
    assert detokenize(loaded.vocab, tokens) == " " + text


def test_tokenize_chatml_specials(loaded: Loaded) -> None:
    tokens = tokenize(loaded.vocab, CHATML_TEXT, add_special=True, parse_special=True)
    assert tokens[:2] == [BOS_ID, IM_START_ID], tokens
    assert tokens.count(IM_START_ID) == 2 and tokens.count(IM_END_ID) == 1, tokens

    literal = tokenize(loaded.vocab, CHATML_TEXT, add_special=False, parse_special=False)
    assert IM_START_ID not in literal and IM_END_ID not in literal


def test_greedy_is_deterministic(loaded: Loaded) -> None:
    tokens = tokenize(loaded.vocab, CHATML_TEXT, add_special=True, parse_special=True)
    first = decode(loaded.ctx, tokens, seq_id=0, pos0=0)

    ctx2 = _new_context(loaded.model)
    try:
        second = decode(ctx2, tokens, seq_id=0, pos0=0)
    finally:
        llama_cpp.llama_free(ctx2)

    assert np.isfinite(first).all()
    assert float(first.std()) > 0.1, "logits nearly flat: greedy choice would be fragile"
    assert int(first.argmax()) == int(second.argmax())
    np.testing.assert_array_equal(first, second)


def test_seq_state_copies_to_another_sequence(loaded: Loaded) -> None:
    ctx = loaded.ctx
    prompt = tokenize(loaded.vocab, CHATML_TEXT, add_special=True, parse_special=True)
    decode(ctx, prompt, seq_id=0, pos0=0)

    blob = get_seq_state(ctx, 0)
    set_seq_state(ctx, blob, 1)
    mem = llama_cpp.llama_get_memory(ctx)
    assert llama_cpp.llama_memory_seq_pos_max(mem, 1) == len(prompt) - 1

    # The blob holds no logits: decode one more token in each sequence and compare.
    extra = [int(tokenize(loaded.vocab, " the", add_special=False, parse_special=False)[0])]
    logits0 = decode(ctx, extra, seq_id=0, pos0=len(prompt))
    logits1 = decode(ctx, extra, seq_id=1, pos0=len(prompt))
    np.testing.assert_allclose(logits1, logits0, rtol=1e-5, atol=1e-5)
    assert int(logits0.argmax()) == int(logits1.argmax())


STATE_SEQ_MAGIC = 0xAF143CD8  # llama-context.cpp ``io_magic``, first u32 of every blob


def test_state_blob_header_and_sections(loaded: Loaded) -> None:
    """A blob is ``u32 magic, i32 seq_id`` then one section per KV cache.

    Each section starts ``u32 n_stream, u32 cell_count``; an empty sequence's blob is
    therefore 16 bytes with one cache (llama) and 24 with two (gemma3: base + SWA).
    """
    n_sections = 2 if llama_cpp.llama_model_n_swa(loaded.model) > 0 else 1
    empty = get_seq_state(loaded.ctx, 2)
    assert len(empty) == 8 + 8 * n_sections, f"{len(empty)=}, {n_sections=}"

    prompt = tokenize(loaded.vocab, CHATML_TEXT, add_special=True, parse_special=True)
    decode(loaded.ctx, prompt, seq_id=0, pos0=0)
    magic, seq_id, n_stream, cell_count = struct.unpack_from("<IiII", get_seq_state(loaded.ctx, 0))
    assert (magic, seq_id, n_stream, cell_count) == (STATE_SEQ_MAGIC, 0, 1, len(prompt))


def test_gemma3_blob_keeps_only_the_window_in_swa_section(tiny_gemma3_path: Path) -> None:
    """Pins a llama.cpp behaviour the pool must respect (even with ``swa_full``).

    ``state_write`` skips SWA-masked cells, so a restored gemma3 sequence holds only
    the last ``n_swa`` positions in its SWA cache: ``seq_pos_min`` is ``n - n_swa``,
    the next-token logits match, but ``seq_rm`` below that position and re-decoding
    gives different logits than the original sequence. A restored iSWA sequence can
    only be extended, not truncated below ``seq_pos_min``; re-prefill instead.
    """
    model = _load_model(tiny_gemma3_path)
    ctx = _new_context(model)
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        n_swa = llama_cpp.llama_model_n_swa(model)
        text = "the user wants code and the agent will plan the review of the data " * 2
        prompt = tokenize(vocab, text, add_special=True, parse_special=False)
        assert len(prompt) > 2 * n_swa, f"{len(prompt)=}, {n_swa=}"
        decode(ctx, prompt, seq_id=0, pos0=0)
        set_seq_state(ctx, get_seq_state(ctx, 0), 1)

        mem = llama_cpp.llama_get_memory(ctx)
        assert llama_cpp.llama_memory_seq_pos_min(mem, 0) == 0
        assert llama_cpp.llama_memory_seq_pos_min(mem, 1) == len(prompt) - n_swa
        assert llama_cpp.llama_memory_seq_pos_max(mem, 1) == len(prompt) - 1
    finally:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)


def _meta(model: ctypes.c_void_p, key: str) -> str:
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    assert n >= 0, f"no metadata {key!r}"
    return buf.value.decode()


def test_qwen2_fixture_loads_as_qwen2_with_its_template(tiny_qwen2_path: Path) -> None:
    model = _load_model(tiny_qwen2_path)
    try:
        assert _meta(model, "general.architecture") == "qwen2"
        assert llama_cpp.llama_model_n_swa(model) == 0, "qwen2 has no sliding window"
        template = llama_cpp.llama_model_chat_template(model, None)
        assert template is not None and template.decode() == QWEN2_TEMPLATE
        vocab = llama_cpp.llama_model_get_vocab(model)
        assert llama_cpp.llama_vocab_eos(vocab) == IM_END_ID == llama_cpp.llama_vocab_eot(vocab)
        tokens = tokenize(vocab, CHATML_TEXT, add_special=True, parse_special=True)
        assert tokens[0] == IM_START_ID, "Qwen adds no BOS"
        ctx = _new_context(model)
        try:
            logits = decode(ctx, tokens, seq_id=0, pos0=0)
            assert np.isfinite(logits).all()
            blob = get_seq_state(ctx, 0)
            magic, seq_id, n_stream, cell_count = struct.unpack_from("<IiII", blob)
            assert (magic, n_stream, cell_count) == (STATE_SEQ_MAGIC, 1, len(tokens)), "one KV cache section"
            assert len(get_seq_state(ctx, 3)) == 16, "an empty sequence: header + one section"
        finally:
            llama_cpp.llama_free(ctx)
    finally:
        llama_cpp.llama_model_free(model)


def test_qwen2_build_is_deterministic_and_other_archs_unchanged(tmp_path: Path, tiny_model_path: Path) -> None:
    a = build_tiny_gguf(tmp_path / "a.gguf", arch="qwen2", chat_template=QWEN2_TEMPLATE).read_bytes()
    assert a == build_tiny_gguf(tmp_path / "b.gguf", arch="qwen2", chat_template=QWEN2_TEMPLATE).read_bytes()
    assert build_tiny_gguf(tmp_path / "l.gguf").read_bytes() == tiny_model_path.read_bytes()
