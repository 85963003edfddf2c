#!/usr/bin/env bash
# Builds Lazaret's release binaries into target/release: the host CLI and
# role binaries, and lazaret-escalate as a static executable (it runs inside
# sandboxes whose images may have no C library).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> building lazaret and its role binaries (release)"
cargo build --release --locked --workspace --bins

echo "==> building lazaret-escalate as a static executable"
cargo rustc --release --locked -p lazaret-escalation-client --bin lazaret-escalate \
    -- -C target-feature=+crt-static
if readelf -l target/release/lazaret-escalate | grep -q 'INTERP'; then
    echo "error: target/release/lazaret-escalate is dynamically linked" >&2
    exit 1
fi
echo "==> binaries in $(pwd)/target/release"
