#!/usr/bin/env bash
# Sets up this machine for Lazaret and runs its main job on the built-in
# default profile (packaging/examples/busybox.toml) for a demo project.
#
# In this version the main job is `lazaret config check`: the full load that
# `lazaret up` will perform, creating Lazaret's Storage and Runtime roots and
# printing the Domain it would start.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

echo "==> installing system packages"
export DEBIAN_FRONTEND=noninteractive
as_root apt-get update -q
# gcc and libc6-dev link the static escalation client; util-linux provides
# setpriv for the tests that run as an unprivileged user.
as_root apt-get install -y -q --no-install-recommends \
    ca-certificates gcc libc6-dev util-linux binutils

packaging/build.sh

# Lazaret keeps runtime state under $XDG_RUNTIME_DIR/lazaret. A login session
# sets XDG_RUNTIME_DIR; a bare root shell or CI does not, so make the usual one.
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
    export XDG_RUNTIME_DIR="/run/user/$(id -u)"
    if [ ! -d "$XDG_RUNTIME_DIR" ]; then
        as_root install -d -m 0700 -o "$(id -u)" -g "$(id -g)" "$XDG_RUNTIME_DIR"
    fi
fi

demo="${LAZARET_DEMO_WORKSPACE:-$HOME/lazaret-demo}"
mkdir -p "$demo"
echo "==> lazaret config check default (workspace $demo)"
target/release/lazaret config check default \
    --config "$(pwd)/packaging/examples/busybox.toml" \
    --workspace "$demo"
