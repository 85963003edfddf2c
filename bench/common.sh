# shellcheck shell=bash
# Shared by the benchmark scripts (sourced, not run): timing, medians and
# ratios, reading `lazaret status --json`, and a scratch Lazaret host with
# the busybox image and one profile `bench`.

now() { date +%s%N; }
ms() { echo $(( ($2 - $1) / 1000000 )); }
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }

# field EXPR: a field of the first Domain in $status (`lazaret status --json`).
field() { python3 -c "import json,sys; print(json.load(sys.stdin)['domains'][0]$1)" <<<"$status"; }

# bench_setup [PROFILE...]: builds the release binaries; sets $lazaret and
# a scratch directory $scratch with HOME and XDG_RUNTIME_DIR in it; at
# exit, takes each PROFILE (default `bench`) down and removes $scratch.
bench_setup() {
    cargo build --release --locked --workspace --bins -q
    lazaret=$(pwd)/target/release/lazaret
    scratch=$(mktemp -d /tmp/lazaret-bench.XXXXXX)
    export HOME=$scratch/home XDG_RUNTIME_DIR=$scratch/run
    bench_profiles=("${@:-bench}")
    trap bench_cleanup EXIT
}
bench_cleanup() {
    local p
    for p in "${bench_profiles[@]}"; do
        "$lazaret" down "$p" --workspace "$scratch/project" >/dev/null 2>&1 || true
    done
    chmod -R u+rwX "$scratch" 2>/dev/null || true
    rm -rf "$scratch"
}

# domain_exec: sets the array exec_cmd to the command that runs a program
# inside the Domain whose status is in $status: `runsc exec` in its
# namespaces, as `lazaret attach` does, without Lazaret in the way.
domain_exec() {
    exec_cmd=(nsenter -t "$(field "['namespace_holder']['pid']")" -U -m -n -p --preserve-credentials --
              runsc --rootless --ignore-cgroups --network=host --root "$(field "['runsc_root']")"
              exec "$(field "['container_id']")")
}

# bench_host SCRATCH [TOML...]: under SCRATCH, a home whose configuration
# has profile `bench` on the busybox image (with /root persistent and the
# extra TOML lines given), a 0700 runtime dir and an empty project.
bench_host() {
    local scratch=$1
    shift
    mkdir -p "$scratch/home/.config/lazaret" "$scratch/run" "$scratch/project"
    chmod 700 "$scratch/run"
    bash packaging/build-busybox-image.sh "$scratch/image" latest >/dev/null
    {
        echo 'schema = "lazaret-trusted-host-config-v1"'
        echo '[profiles.bench]'
        echo "image = \"oci:$scratch/image:latest\""
        echo 'persistent_dirs = ["/root"]'
        printf '%s\n' "$@"
    } > "$scratch/home/.config/lazaret/config.toml"
    chmod 600 "$scratch/home/.config/lazaret/config.toml"
}

# test_net_setup SCRIPT LETTER: for a benchmark run as root that runs
# Lazaret as the unprivileged BENCH_USER (default: the sudo user, else
# nobody) beside a test network namespace. Refuses to run otherwise.
# Builds the release binaries unless LAZARET_BIN_DIR names them, and copies
# them to $scratch/bin ($lazaret is the CLI there). Makes the namespace
# $ns, named as the tests' TestNet names its own (`lzt-<pid>-<n>`,
# `lztr<pid % 10000>…`, LETTER ending the link names), so a test run's
# stale clean-up keeps it while the script runs and removes it if the
# script is killed: $root_link holds 198.18.0.1/24 on the root side, its
# peer $test_link 198.18.0.10/24 inside. Sets user, uid, gid, as_user
# (runs a command as the user, with the scratch HOME and runtime dir) and
# an exit trap that takes profile `bench` down, stops each pid in
# $servers, and removes the network and $scratch.
test_net_setup() {
    local script=$1 letter=$2 tag
    user=${BENCH_USER:-${SUDO_USER:-nobody}}
    if [ "$(id -u)" != 0 ]; then
        echo "$script must run as root: it creates a test network namespace" >&2
        exit 2
    fi
    uid=$(id -u "$user")
    gid=$(id -g "$user")
    if [ "$uid" = 0 ]; then
        echo "BENCH_USER must be an unprivileged user, not $user" >&2
        exit 2
    fi
    if [ -z "${LAZARET_BIN_DIR:-}" ]; then
        cargo build --release --locked --workspace --bins -q
        LAZARET_BIN_DIR=$(pwd)/target/release
    fi
    tag=$(printf '%04d' $(($$ % 10000)))
    ns=lzt-$$-bench
    root_link=lztr${tag}$letter
    test_link=lzth${tag}$letter
    servers=()
    scratch=$(mktemp -d /tmp/lazaret-bench.XXXXXX)
    chmod 755 "$scratch"
    trap test_net_cleanup EXIT
    mkdir -p "$scratch/bin"
    find "$LAZARET_BIN_DIR" -maxdepth 1 -type f -name 'lazaret*' -perm -u+x ! -name '*.d' \
        -exec install -m 0755 {} "$scratch/bin/" \;
    lazaret=$scratch/bin/lazaret
    [ -x "$lazaret" ] || { echo "no lazaret binary in $LAZARET_BIN_DIR" >&2; exit 1; }
    ip netns add "$ns"
    ip link add "$root_link" type veth peer name "$test_link"
    ip link set "$test_link" netns "$ns"
    ip addr add 198.18.0.1/24 dev "$root_link"
    ip link set "$root_link" up
    ip -n "$ns" addr add 198.18.0.10/24 dev "$test_link"
    ip -n "$ns" link set "$test_link" up
    ip -n "$ns" link set lo up
}
as_user() {
    setpriv --reuid="$uid" --regid="$gid" --clear-groups -- \
        env -i HOME="$scratch/home" XDG_RUNTIME_DIR="$scratch/run" PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"
}
test_net_cleanup() {
    local pid
    if [ -x "$scratch/bin/lazaret" ]; then
        (cd "$scratch/project" && as_user "$scratch/bin/lazaret" down bench >/dev/null 2>&1) || true
    fi
    for pid in "${servers[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    ip link del "$root_link" 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "$scratch"
}
