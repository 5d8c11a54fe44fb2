"""The codec package's public surface and its one-way imports (layout <- kernels <- formats <- container)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import agentmem.codec as C

PACKAGE = Path(C.__file__).parent
ORDER = ["layout", "kernels", "formats", "container", "surgery"]


def test_codec_api_is_pinned() -> None:
    assert sorted(C.__all__) == sorted(
        [
            "BLOB_MAGIC", "CODECS", "ENCODED_MAGIC", "FORMAT_VERSION", "GGML_F16", "GGML_Q4_0", "GGML_Q8_0",
            "KERNELS", "Codec", "CodecSpec", "EncodedInfo", "F16Codec", "Kernels", "NativeKernels",
            "NumpyKernels", "Q4_0Codec", "Q8_0Codec", "QuantCodec", "SectionLayout", "StateLayout",
            "StreamLayout", "TensorLayout", "checksum", "decode_state", "encode_state", "encoded_info",
            "get_codec", "get_kernels", "hadamard", "is_encoded", "join_state", "parse_state", "split_state",
        ]
    )  # fmt: skip
    assert all(hasattr(C, name) for name in C.__all__)


def test_package_docstring_names_every_module() -> None:
    doc = C.__doc__ or ""
    for name in ORDER:
        importlib.import_module(f"agentmem.codec.{name}")
        assert f"`{name}`" in doc, name


def test_modules_import_only_lower_ones() -> None:
    """A module of the package imports only the modules before it in ORDER (surgery: layout only).

    Regression (issue #24): kernels loaded the C extension with `from agentmem import _native`,
    an import of the package face, which sits floors above the codec.
    """
    for i, name in enumerate(ORDER):
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        used = {m.rsplit(".", 1)[-1] for m in modules if m.startswith("agentmem.codec.")}
        allowed = {"layout"} if name == "surgery" else set(ORDER[:i])
        assert used <= allowed, f"{name=}, {used=}, {allowed=}"
        # the C extension is below the codec; the package face `agentmem` (its __init__) is far above
        lower = ("agentmem.codec.", "agentmem.errors", "agentmem._native")
        upward = {m for m in modules if (m == "agentmem" or m.startswith("agentmem.")) and not m.startswith(lower)}
        assert not upward, f"{name=}, {upward=}"
