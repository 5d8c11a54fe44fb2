#!/usr/bin/env bash
# Install llama-cpp-python into the virtualenv of PYTHON ($1), built once per set of
# build flags and kept in ~/.cache/agentmem/wheels/<key>/ (pip's own wheel cache is
# keyed by the source archive only: it would hand back a wheel built with other flags).
#
# CMAKE_ARGS is passed through (e.g. -DGGML_CUDA=on, -DGGML_METAL=on). On CPUs that
# advertise AMX (Intel Sapphire Rapids and later) llama.cpp's native build turns on its
# AMX kernels, which crash in virtual machines that do not grant AMX state (SIGSEGV in
# ggml_backend_amx_mul_mat on the first quantized matmul). There the build targets
# AVX2/AVX-512 without AMX instead, unless CMAKE_ARGS already says GGML_NATIVE.
set -euo pipefail
python=${1:?usage: install_llama.sh PYTHON}
version=0.3.36
args=${CMAKE_ARGS:-}
if grep -qw amx_int8 /proc/cpuinfo 2>/dev/null && [[ "$args" != *GGML_NATIVE* ]]; then
  args="$args -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
  grep -qw avx512f /proc/cpuinfo && args="$args -DGGML_AVX512=ON"
  grep -qw avx512_vnni /proc/cpuinfo && args="$args -DGGML_AVX512_VNNI=ON"
  grep -qw avx512_bf16 /proc/cpuinfo && args="$args -DGGML_AVX512_BF16=ON"
  grep -qw avx512vbmi /proc/cpuinfo && args="$args -DGGML_AVX512_VBMI=ON"
fi
key=$(printf '%s %s %s' "$version" "$args" "$(uname -m)" | sha256sum | cut -c1-16)
dir=${XDG_CACHE_HOME:-$HOME/.cache}/agentmem/wheels/$key
if ! ls "$dir"/llama_cpp_python-$version-*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $version (CMAKE_ARGS='$args'): about 6 minutes on 2 cores" >&2
  mkdir -p "$dir.tmp"
  CMAKE_ARGS="$args" "$python" -m pip wheel --no-cache-dir --no-deps "llama-cpp-python==$version" -w "$dir.tmp"
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
  printf '%s\n' "$args" > "$dir/CMAKE_ARGS"
fi
"$python" -m pip install --force-reinstall --no-deps "$dir"/llama_cpp_python-$version-*.whl
