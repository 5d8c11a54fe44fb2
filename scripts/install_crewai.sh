#!/usr/bin/env bash
# Make sure a CrewAI virtualenv (.venv-crewai) exists for tests/integration/clients/test_crewai.py.
#
# CrewAI 1.15 pins openai<3 while the project's venv has openai 3, so CrewAI cannot live in
# .venv: it gets its own virtualenv, made with the given interpreter (default python3), with
# only `crewai==1.15.*` from PyPI in it. The test runs tests/integration/clients/crewai_run.py
# in it as a subprocess against an `agentmem serve` the test started; the agentmem package is
# not installed there (the script talks HTTP only).
#
# Idempotent: a stamp file holding the requirement says the venv is complete; the script then
# does nothing. Delete .venv-crewai (or change CREWAI_SPEC) to reinstall. Quiet unless pip fails.
#   usage: bash scripts/install_crewai.sh [python]      (AGENTMEM_CREWAI_VENV overrides the path)
set -euo pipefail

python=${1:-python3}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${AGENTMEM_CREWAI_VENV:-$root/.venv-crewai}
spec=${CREWAI_SPEC:-crewai==1.15.*}
stamp=$venv/.crewai-installed

if [[ -f $stamp && $(cat "$stamp") == "$spec" && -x $venv/bin/python ]]; then
  exit 0
fi
echo "install_crewai.sh: installing $spec into $venv" >&2
rm -f "$stamp"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$spec"
"$venv/bin/python" -c "import crewai" || { echo "install_crewai.sh: crewai does not import" >&2; exit 1; }
echo "$spec" >"$stamp"
