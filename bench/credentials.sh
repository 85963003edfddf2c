#!/usr/bin/env bash
# Times the Credential Proxy against a direct TLS connection to the same
# test API from inside the same sandbox, in one run. The test API
# (`lazaret-testapi`) listens in a test network namespace under two names
# that the test's DNS server gives the same address: `api.test.invalid`,
# a credential host (so Lazaret's resolver answers it with the proxy), and
# `direct.test.invalid`, only allowed (so the sandbox reaches it itself,
# trusting the test CA as well as the sandbox's own bundle). Inside one `lazaret attach` per
# batch, fresh curl processes alternate between the two:
#   - time to first byte of a streamed response (`/stream?chunks=1`; a
#     fresh TLS connection each: what a first request costs), median ms;
#   - throughput of a large response (`/bytes`), median MiB/s;
#   - a streamed response of 20 events 50 ms apart through the proxy: it
#     takes about 1 s and its first event arrives at once (not buffered).
# Prints medians, the overhead and the ratio against the issue's targets
# (first byte at most 2 ms over direct, throughput at least 0.8x).
#
# usage: bench/credentials.sh [ROUNDS] [MIB]   (default 100 rounds, 256 MiB)
# Run it as root with LAZARET_AGENT_IMAGE naming an image that has curl
# (packaging/images/build-agent-image.sh builds one): it creates a test
# network namespace and veth pair (named like the tests' TestNet, removed
# on exit) and runs Lazaret as the unprivileged user BENCH_USER (default:
# the sudo user, else nobody), with scratch directories only.
# LAZARET_BIN_DIR=DIR uses the Lazaret binaries (and lazaret-testapi) in DIR
# instead of building target/release. Do not run it beside the network
# tests: both use 198.18.0.1/24 on the root side.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
rounds=${1:-100}
mib=${2:-256}
throughput_rounds=5

if [ -z "${LAZARET_AGENT_IMAGE:-}" ]; then
    echo "LAZARET_AGENT_IMAGE must name an image with curl, such as oci:DIR:claude" \
         "(packaging/images/build-agent-image.sh claude DIR builds it)" >&2
    exit 2
fi
test_net_setup bench/credentials.sh c
[ -x "$scratch/bin/lazaret-testapi" ] || {
    echo "no lazaret-testapi in $LAZARET_BIN_DIR" >&2
    exit 1
}

# The test's DNS server on the link; the test API on a host behind it (the
# network of a link the host is on is never allowed to the sandbox).
address=198.18.0.10
api_address=198.18.2.10
api=api.test.invalid
direct=direct.test.invalid
ip -n "$ns" addr add "$api_address/32" dev "$test_link"
ip route add 198.18.2.0/24 via "$address" dev "$root_link"

# wait_for FILE LINE WHAT: until FILE holds LINE (5 s at most).
wait_for() {
    for _ in $(seq 50); do
        grep -qx "$2" "$1" 2>/dev/null && return
        sleep 0.1
    done
    echo "$3 did not start: $(cat "$1" 2>/dev/null)" >&2
    exit 1
}
ip netns exec "$ns" "$scratch/bin/lazaret-testapi" --listen "$api_address:443" \
    --names "$api,$direct" --ca-out "$scratch/test-ca.pem" --log /dev/null \
    >"$scratch/api.out" 2>&1 &
servers+=($!)
wait_for "$scratch/api.out" ready "the test API"
chmod 644 "$scratch/test-ca.pem"
ip netns exec "$ns" dnsmasq --keep-in-foreground --conf-file=/dev/null --no-resolv \
    --no-hosts --bind-interfaces --listen-address="$address" --port=53 --local-ttl=5 \
    --user=root --pid-file= --address="/$api/$api_address" --address="/$direct/$api_address" \
    >"$scratch/dns.out" 2>&1 &
servers+=($!)

# The user's scratch host: a v2 profile on the agent image allowing both
# names, with a credential for the API host.
mkdir -p "$scratch/home/.config/lazaret" "$scratch/run" "$scratch/project"
chmod 700 "$scratch/run"
cat >"$scratch/home/.config/lazaret/config.toml" <<EOF
schema = "lazaret-trusted-host-config-v2"
[profiles.bench]
image = "$LAZARET_AGENT_IMAGE"
persistent_dirs = []
allow_hosts = ["$api", "$direct"]
[[profiles.bench.credentials]]
env = "API_KEY"
value = "env:BENCH_KEY"
hosts = ["$api"]
EOF
chmod 600 "$scratch/home/.config/lazaret/config.toml"
install -m 0644 "$scratch/test-ca.pem" "$scratch/project/test-ca.pem"
chown -R "$uid:$gid" "$scratch/home" "$scratch/run" "$scratch/project"
cd "$scratch/project"

# slirp4netns forwards DNS to the resolvers of its /etc/resolv.conf: in a
# private mount namespace that names the test's DNS server. `up` trusts
# the test CA (the proxy verifies the API against the host's trust store).
printf 'nameserver %s\n' "$address" >"$scratch/resolv.conf"
chmod 644 "$scratch/resolv.conf"
for _ in $(seq 50); do
    ip netns exec "$ns" bash -c "exec 3<>/dev/tcp/$address/53" 2>/dev/null && break
    sleep 0.1
done
if ! unshare --mount --propagation private -- /bin/sh -c \
        'mount --bind "$0" /etc/resolv.conf && shift && exec "$@"' \
        "$scratch/resolv.conf" _ \
        setpriv --reuid="$uid" --regid="$gid" --clear-groups -- \
        env -i HOME="$scratch/home" XDG_RUNTIME_DIR="$scratch/run" PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        BENCH_KEY=sk-ant-api03-bench-real-value SSL_CERT_FILE="$scratch/test-ca.pem" \
        "$lazaret" up bench >"$scratch/up.log" 2>&1; then
    echo "lazaret up failed:" >&2
    cat "$scratch/up.log" >&2
    exit 1
fi

# inside SCRIPT: runs SCRIPT in the sandbox, in one attach; its output.
inside() {
    local out
    if ! out=$(as_user "$lazaret" attach bench -- /bin/sh -c "$1" </dev/null 2>&1); then
        echo "failed inside the sandbox: $out" >&2
        exit 1
    fi
    printf '%s\n' "$out"
}
phases='%{time_namelookup} %{time_connect} %{time_appconnect} %{time_starttransfer}\n'
proxied="curl -sS --fail -o /dev/null -H \"x-api-key: \$API_KEY\" https://$api"
straight="curl -sS --fail -o /dev/null --cacert /tmp/direct-ca.pem https://$direct"

# Both paths must work before anything is timed. The direct path trusts
# what the proxied one does (the sandbox's bundle: the image's CAs and the
# proxy's) plus the test CA: a client reads its whole trust store before
# a handshake, which takes longer than the handshake on the loopback.
inside "cat \"\$SSL_CERT_FILE\" /workspace/test-ca.pem >/tmp/direct-ca.pem &&
    $proxied/echo && $straight/echo" >/dev/null

# Time to first byte: fresh curl processes, alternating, in one attach.
first=$(inside "for i in \$(seq $rounds); do
    $proxied/stream?chunks=1\\&size=16 -w 'proxy $phases'
    $straight/stream?chunks=1\\&size=16 -w 'direct $phases'
done")
# phase PATH FIELD: the rounds' figures of PATH (proxy or direct), in ms:
# FIELD 5 is the first byte; 2 the lookup, 3 - 2 the TCP connection, 4 - 3
# the TLS handshake, 5 - 4 the request until its first byte.
phase() { awk -v path="$1" "\$1 == path {printf \"%.3f\\n\", ($2) * 1000}" <<<"$first"; }
mapfile -t proxy_ms < <(phase proxy '$5')
mapfile -t direct_ms < <(phase direct '$5')
[ "${#proxy_ms[@]}" = "$rounds" ] && [ "${#direct_ms[@]}" = "$rounds" ] || {
    echo "unexpected output of the first-byte rounds: $first" >&2
    exit 1
}

# Throughput: a large response to /dev/null, alternating.
bytes=$((mib * 1048576))
out=$(inside "for i in \$(seq $throughput_rounds); do
    $proxied/bytes?n=$bytes -w 'proxy %{speed_download}\n'
    $straight/bytes?n=$bytes -w 'direct %{speed_download}\n'
done")
to_mib() { awk '{printf "%.1f\n", $1 / 1048576}'; }
mapfile -t proxy_rate < <(awk '$1 == "proxy" {print $2}' <<<"$out" | to_mib)
mapfile -t direct_rate < <(awk '$1 == "direct" {print $2}' <<<"$out" | to_mib)
[ "${#proxy_rate[@]}" = "$throughput_rounds" ] && [ "${#direct_rate[@]}" = "$throughput_rounds" ] || {
    echo "unexpected output of the throughput rounds: $out" >&2
    exit 1
}

# A stream of 20 events 50 ms apart: through the proxy, the first arrives
# at once and the whole takes about 1 s.
out=$(inside "$proxied/stream?chunks=20\\&delay_ms=50\\&size=64 \
    -w 'stream %{time_starttransfer} %{time_total}\n'")
read -r stream_first stream_total < <(awk '$1 == "stream" {print $2 * 1000, $3 * 1000}' <<<"$out")

pm=$(median "${proxy_ms[@]}"); dm=$(median "${direct_ms[@]}")
pr=$(median "${proxy_rate[@]}"); dr=$(median "${direct_rate[@]}")
overhead=$(awk -v a="$pm" -v b="$dm" 'BEGIN {printf "%.2f", a - b}')
rate_ratio=$(ratio "$pr" "$dr")
met() { awk "BEGIN {exit !($1)}" && echo met || echo "NOT met"; }
printf 'rounds: %s for the first byte (a fresh TLS connection each), %s of %s MiB for throughput\n' \
    "$rounds" "$throughput_rounds" "$mib"
printf 'first byte  through the proxy median %8s ms   direct TLS median %8s ms   overhead %s ms (target <= 2 ms: %s)\n' \
    "$pm" "$dm" "$overhead" "$(met "$overhead <= 2")"
for path in proxy direct; do
    printf 'first byte  %-6s phases: lookup %s ms, TLS handshake %s ms, request to first byte %s ms (medians)\n' \
        "$path" "$(median $(phase "$path" '$2'))" "$(median $(phase "$path" '$4 - $3'))" \
        "$(median $(phase "$path" '$5 - $4'))"
done
printf 'throughput  through the proxy median %8s MiB/s   direct TLS median %8s MiB/s   ratio %s (target >= 0.8: %s)\n' \
    "$pr" "$dr" "$rate_ratio" "$(met "$rate_ratio >= 0.8")"
printf 'stream      20 events 50 ms apart through the proxy: first at %.0f ms, last at %.0f ms (unbuffered: %s)\n' \
    "$stream_first" "$stream_total" "$(met "$stream_first < 500 && $stream_total >= 900")"
