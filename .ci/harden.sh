#!/bin/sh
# bubblewrap for the sandbox of generated code (tests/test_sandbox_isolation.py and
# tests/test_search_sandbox.py fail in CI without it); setpriv comes with util-linux.
# Idempotent: installs only what is missing. Needs root (or sudo) for apt-get.
set -eu
if command -v bwrap >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
fi
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q bubblewrap
bwrap --version
