#!/usr/bin/env bash
# nginx for agentmem's scale-out route (docs/scale-out.md) and its failover test.
# Debian/Ubuntu: the nginx-light package (the smallest build that has the upstream
# `hash ... consistent` module); elsewhere nginx from the system's package manager.
# Idempotent: does nothing when an nginx binary is already installed. When it cannot
# install (no root, no package manager) it says so and exits 0: the tests that need
# nginx then skip with that reason.
set -euo pipefail

if command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; then
  exit 0
fi
sudo_cmd=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo_cmd="sudo"; else
    echo "install_nginx.sh: not root and no sudo; install nginx yourself (Debian: apt-get install nginx-light)" >&2
    exit 0
  fi
fi
if command -v apt-get >/dev/null 2>&1; then
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends nginx-light
  # the package enables a system nginx on port 80; agentmem runs its own with its own config
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet nginx 2>/dev/null; then
    $sudo_cmd systemctl disable --now nginx || true
  fi
elif command -v dnf >/dev/null 2>&1; then
  $sudo_cmd dnf install -y nginx
elif command -v brew >/dev/null 2>&1; then
  brew install nginx
else
  echo "install_nginx.sh: no apt-get/dnf/brew; install nginx yourself" >&2
  exit 0
fi
