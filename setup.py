"""Build of the optional native codec kernels, ``agentmem._native`` (sources in ``native/``).

Project metadata lives in ``pyproject.toml``; this file only declares the C
extension. It is optional: without a working C compiler the build logs a warning
and agentmem uses its numpy kernels, which produce identical bytes.

Build in place for development::

    python setup.py build_ext --inplace
"""

from __future__ import annotations

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# Exactness of the kernels depends on IEEE binary32 arithmetic without fused
# multiply-add (aarch64 compilers contract a*b+c by default), and on not using
# -ffast-math. The AVX2/F16C code is enabled per function and chosen at run time,
# so no -march flag is needed and the module runs on any CPU of the architecture.
_UNIX_FLAGS = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-std=c11"]
_MSVC_FLAGS = ["/O2", "/fp:precise"]


class BuildNative(build_ext):
    """``build_ext`` that picks optimisation flags for the compiler in use."""

    def build_extensions(self) -> None:
        flags = _MSVC_FLAGS if self.compiler.compiler_type == "msvc" else _UNIX_FLAGS
        for ext in self.extensions:
            ext.extra_compile_args = list(flags) + list(ext.extra_compile_args or [])
        super().build_extensions()

    def get_source_files(self) -> list[str]:
        # Put the headers (``depends``) into the sdist too; older setuptools lists
        # only the .c sources, and a source build would then miss kernels.h.
        files = list(super().get_source_files())
        for ext in self.extensions:
            files.extend(dep for dep in ext.depends if dep not in files)
        return files


setup(
    ext_modules=[
        Extension(
            "agentmem._native",
            sources=["native/module.c", "native/kernels.c"],
            depends=["native/kernels.h"],
            include_dirs=["native"],
            optional=True,
        )
    ],
    cmdclass={"build_ext": BuildNative},
)
