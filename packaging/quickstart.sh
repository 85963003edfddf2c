#!/usr/bin/env bash
# Sets up this machine for Lazaret and runs its main job on the built-in
# default: a small local image built from Debian's busybox-static (no
# registry is needed), the default profile of packaging/examples/busybox.toml,
# and a demo project. The main job: `lazaret up`, `lazaret status`, a command
# run inside the sandbox with `lazaret attach` that writes into the project,
# `lazaret down`.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

echo "==> installing system packages"
export DEBIAN_FRONTEND=noninteractive
as_root apt-get update -q
# runsc is gVisor; busybox-static and umoci build the default image;
# skopeo fetches registry images; gcc and libc6-dev link the static
# escalation client; util-linux and procps give nsenter, setpriv and ps;
# slirp4netns is the sandbox's only way out to the network.
as_root apt-get install -y -q --no-install-recommends \
    ca-certificates gcc libc6-dev util-linux binutils procps \
    runsc busybox-static umoci skopeo slirp4netns
bash packaging/device-access.sh
bash packaging/install-runsc.sh

packaging/build.sh
lazaret="$(pwd)/target/release/lazaret"

# Lazaret keeps runtime state under $XDG_RUNTIME_DIR/lazaret. A login session
# sets XDG_RUNTIME_DIR; a bare root shell or CI does not, so make the usual one.
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
    export XDG_RUNTIME_DIR="/run/user/$(id -u)"
    if [ ! -d "$XDG_RUNTIME_DIR" ]; then
        as_root install -d -m 0700 -o "$(id -u)" -g "$(id -g)" "$XDG_RUNTIME_DIR"
    fi
fi

images="${LAZARET_IMAGES:-$HOME/.local/share/lazaret-images}"
echo "==> building the default image (busybox) into $images/busybox"
bash packaging/build-busybox-image.sh "$images/busybox" latest

config="${XDG_CONFIG_HOME:-$HOME/.config}/lazaret/quickstart.toml"
echo "==> writing the default profile to $config"
mkdir -p "$(dirname "$config")"
sed "s|oci:/usr/local/share/lazaret/images/busybox:latest|oci:$images/busybox:latest|" \
    packaging/examples/busybox.toml > "$config.tmp"
chmod 600 "$config.tmp"
mv "$config.tmp" "$config"

demo="${LAZARET_DEMO_WORKSPACE:-$HOME/lazaret-demo}"
mkdir -p "$demo"
cd "$demo"
echo "==> lazaret up default (workspace $demo)"
"$lazaret" --config "$config" up default
"$lazaret" --config "$config" status default

echo "==> lazaret attach default -- sh -c '...'"
"$lazaret" --config "$config" attach default -- sh -c 'echo "hello from $(uname -n)" > /workspace/hello.txt; uname -a'
echo "==> the sandbox wrote $demo/hello.txt: $(cat "$demo/hello.txt")"

echo "==> lazaret down default"
"$lazaret" --config "$config" down default
