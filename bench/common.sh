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
