#!/usr/bin/env bash
# Times the sandbox's network path against the same path without gVisor, in
# one run: TCP throughput (`netprobe send`, MIB MiB a run, median MiB/s) and
# connection setup latency (`netprobe connect … 200`, median of the runs'
# medians) from inside a running Lazaret sandbox to a test host through the
# network policy, beside the same probe run in the Domain's enforcement
# network namespace (entered with nsenter, no gVisor). Then, with a v2
# profile naming a host: the lookup latency through Lazaret's resolver
# (`netprobe lookup … 200` to 127.0.0.53, from the enforcement namespace and
# from inside the sandbox) against a direct query to the same upstream
# (slirp4netns's forwarder, from a socket marked as the resolver's), and
# `up` of that profile against `up` of the v1 profile, alternating. Every
# lookup stays on the machine: slirp4netns runs in a private mount
# namespace whose resolv.conf names the test's DNS server. Prints medians,
# differences and ratios.
#
# usage: bench/network.sh [ROUNDS] [MIB]   (default 7 rounds, 256 MiB)
# Run it as root: it creates a test network namespace and veth pair (named
# like the tests' TestNet, removed on exit) and runs Lazaret as the
# unprivileged user BENCH_USER (default: the sudo user, else nobody), with
# scratch directories only. LAZARET_BIN_DIR=DIR uses the Lazaret binaries in
# DIR instead of building target/release. Do not run it beside the network
# tests: both use 198.18.0.1/24 on the root side.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
rounds=${1:-7}
mib=${2:-256}
connects=200

test_net_setup bench/network.sh b
# The probe, built on its own as a static executable so it runs in the
# busybox image.
rustc --edition 2024 -O -C target-feature=+crt-static tests/netprobe/main.rs -o "$scratch/netprobe"

ip netns exec "$ns" "$scratch/netprobe" serve 198.18.0.10:5001 >"$scratch/serve.out" 2>&1 &
servers+=($!)
for _ in $(seq 50); do
    grep -qx ready "$scratch/serve.out" && break
    sleep 0.1
done
grep -qx ready "$scratch/serve.out" || { echo "the test server did not start: $(cat "$scratch/serve.out")" >&2; exit 1; }

# The user's scratch host, with a profile whose policy allows the test host.
bench_host "$scratch" 'allow_egress = ["198.18.0.10/32"]'
chmod -R a+rX "$scratch/image"
install -m 0755 "$scratch/netprobe" "$scratch/project/netprobe"
chown -R "$uid:$gid" "$scratch/home" "$scratch/run" "$scratch/project"
cd "$scratch/project"
if ! as_user test -r /dev/net/tun -a -w /dev/net/tun; then
    echo "note: /dev/net/tun is not usable by $user, so slirp4netns cannot start" >&2
fi
# slirp4netns forwards DNS to the resolvers of its /etc/resolv.conf: in a
# private mount namespace that names the test's DNS server.
printf 'nameserver 198.18.0.10\n' >"$scratch/resolv.conf"
chmod 644 "$scratch/resolv.conf"
up_under_test_dns() {
    unshare --mount --propagation private -- /bin/sh -c \
        'mount --bind "$0" /etc/resolv.conf && shift && exec "$@"' \
        "$scratch/resolv.conf" _ \
        setpriv --reuid="$uid" --regid="$gid" --clear-groups -- \
        env -i HOME="$scratch/home" XDG_RUNTIME_DIR="$scratch/run" PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        "$lazaret" up bench
}
ip netns exec "$ns" "$scratch/netprobe" dns 198.18.0.10:53 bench.test.invalid=198.19.0.10 \
    >"$scratch/dns.out" 2>&1 &
servers+=($!)
if ! up_under_test_dns >"$scratch/up.log" 2>&1; then
    echo "lazaret up failed:" >&2
    cat "$scratch/up.log" >&2
    exit 1
fi

# `namespace_holder` in `status --json` is `{pid, start_time_ticks}`: the
# host pid of the supervisor's stage two (pid 1 of the Domain pid namespace,
# in the Domain's user and network namespaces; the record behind it is a
# pidfs identity, the JSON gives its pid), and its start time, checked
# against /proc so a reused pid is not entered.
status=$(as_user "$lazaret" status bench --json)
holder=$(field "['namespace_holder']['pid']")
ticks=$(field "['namespace_holder']['start_time_ticks']")
stat=$(cat "/proc/$holder/stat")
read -r -a after_comm <<<"${stat##*) }"
if [ "${after_comm[19]}" != "$ticks" ]; then
    echo "process $holder is not the namespace holder (start time ${after_comm[19]}, expected $ticks)" >&2
    exit 1
fi
sandbox=(as_user "$lazaret" attach bench -- /workspace/netprobe)
bare=(as_user nsenter -t "$holder" -U -n --preserve-credentials -- "$scratch/netprobe")

# One probe run: its output line; on a failure, the failure on stderr and
# a non-zero status (call it as `out=$(probe …)`, so `set -e` stops here).
probe() {
    local out
    if ! out=$("$@" </dev/null 2>&1); then
        echo "failed: ${*: -3}: $out" >&2
        exit 1
    fi
    printf '%s\n' "$out"
}
metric() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p"; }

# Both paths must work before anything is timed.
probe "${sandbox[@]}" talk 198.18.0.10:5001 >/dev/null
probe "${bare[@]}" talk 198.18.0.10:5001 >/dev/null

sandbox_rate=() bare_rate=() sandbox_us=() bare_us=()
for _ in $(seq "$rounds"); do
    out=$(probe "${sandbox[@]}" send 198.18.0.10:5001 "$mib"); sandbox_rate+=("$(metric mib_per_s <<<"$out")")
    out=$(probe "${bare[@]}" send 198.18.0.10:5001 "$mib"); bare_rate+=("$(metric mib_per_s <<<"$out")")
    out=$(probe "${sandbox[@]}" connect 198.18.0.10:5001 "$connects"); sandbox_us+=("$(metric median_us <<<"$out")")
    out=$(probe "${bare[@]}" connect 198.18.0.10:5001 "$connects"); bare_us+=("$(metric median_us <<<"$out")")
done

sr=$(median "${sandbox_rate[@]}"); br=$(median "${bare_rate[@]}")
su=$(median "${sandbox_us[@]}"); bu=$(median "${bare_us[@]}")
printf 'rounds: %s (throughput: %s MiB a run; connect: %s connections a run, median of the medians)\n' \
    "$rounds" "$mib" "$connects"
printf 'throughput  sandbox median %8s MiB/s   no gVisor (Domain netns) median %8s MiB/s   ratio %s\n' \
    "$sr" "$br" "$(ratio "$sr" "$br")"
printf 'connect     sandbox median %8s us      no gVisor (Domain netns) median %8s us      ratio %s\n' \
    "$su" "$bu" "$(ratio "$su" "$bu")"

# Names: the same host, a v2 profile that names a host and no prefix.
config=$scratch/home/.config/lazaret/config.toml
v1_config=$(cat "$config")
v2_config=$(sed -e 's/^schema = .*/schema = "lazaret-trusted-host-config-v2"/' \
    -e 's/^allow_egress = .*/allow_hosts = ["bench.test.invalid"]/' <<<"$v1_config")
as_user "$lazaret" down bench >/dev/null
up_ms() {
    local start end
    start=$(now)
    up_under_test_dns >"$scratch/up.log" 2>&1 || { cat "$scratch/up.log" >&2; exit 1; }
    end=$(now)
    as_user "$lazaret" down bench >/dev/null
    ms "$start" "$end"
}
v1_up=() v2_up=()
for _ in $(seq "$rounds"); do
    printf '%s\n' "$v1_config" >"$config"; v1_up+=("$(up_ms)")
    printf '%s\n' "$v2_config" >"$config"; v2_up+=("$(up_ms)")
done
up_under_test_dns >"$scratch/up.log" 2>&1 || { cat "$scratch/up.log" >&2; exit 1; }
status=$(as_user "$lazaret" status bench --json)
holder=$(field "['namespace_holder']['pid']")
# The invoking user is root of the Domain user namespace, with its
# capabilities there: marking a socket takes CAP_NET_ADMIN.
marked=(as_user nsenter -t "$holder" -U -n --preserve-credentials -- "$scratch/netprobe")
lookups=200
resolver_us=() direct_us=() inside_us=()
for _ in $(seq "$rounds"); do
    out=$(probe "${marked[@]}" lookup 127.0.0.53:53 bench.test.invalid "$lookups"); resolver_us+=("$(metric median_us <<<"$out")")
    out=$(probe "${marked[@]}" lookup 10.0.2.3:53 bench.test.invalid "$lookups" --mark 4c5a0053); direct_us+=("$(metric median_us <<<"$out")")
    out=$(probe "${sandbox[@]}" lookup 127.0.0.53:53 bench.test.invalid "$lookups"); inside_us+=("$(metric median_us <<<"$out")")
done
ru=$(median "${resolver_us[@]}"); du=$(median "${direct_us[@]}"); iu=$(median "${inside_us[@]}")
u1=$(median "${v1_up[@]}"); u2=$(median "${v2_up[@]}")
printf 'lookup      through the resolver median %6s us   direct to the same upstream median %6s us   overhead %s us\n' \
    "$ru" "$du" "$(awk -v a="$ru" -v b="$du" 'BEGIN {print a - b}')"
printf 'lookup      from inside the sandbox median %6s us (through the resolver)\n' "$iu"
printf 'up          v2 with names median %6s ms   v1 prefixes only median %6s ms   difference %s ms\n' \
    "$u2" "$u1" "$(awk -v a="$u2" -v b="$u1" 'BEGIN {print a - b}')"
