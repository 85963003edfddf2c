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
