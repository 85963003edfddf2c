#!/usr/bin/env bash
# Builds Lazaret's release binaries into target/release: the host CLI and
# role binaries. The supervisor's build carries the two programs it places
# in every sandbox, lazaret-init and lazaret-escalate, built static (the
# images they run in may have no C library); this script checks that the
# lazaret-escalate it carries is static.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> building lazaret and its role binaries (release)"
cargo build --release --locked --workspace --bins

escalate=target/lazaret-escalate-static/$(rustc -vV | sed -n 's/^host: //p')/release/lazaret-escalate
if ! [ -x "$escalate" ] || readelf -l "$escalate" | grep -q 'INTERP'; then
    echo "error: $escalate is missing or dynamically linked" >&2
    exit 1
fi
echo "==> binaries in $(pwd)/target/release"
