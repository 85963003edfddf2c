#!/usr/bin/env bash
# Times `lazaret up` (image already prepared) and `lazaret down` against a
# bare rootless `runsc run -detach` / `kill` + `delete` of the same image in
# the same run, taking turns round by round, and prints medians and ratios.
#
# usage: bench/lifecycle.sh [ROUNDS]   (default 15; builds target/release)
# Run it as the user Lazaret runs as; it uses scratch directories only.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
rounds=${1:-15}

bench_setup
bench_host "$scratch"

# Prepare the image once, outside the measurement.
"$lazaret" up bench --workspace "$scratch/project" >/dev/null 2>&1
"$lazaret" down bench --workspace "$scratch/project" >/dev/null

# The bare baseline: the same unpacked image, rootless runsc in a fresh
# user, mount and network namespace, no Lazaret.
rootfs=$(ls -d "$HOME"/.local/share/lazaret/catalog/artifacts/*/rootfs | head -n 1)
bundle=$scratch/bare
mkdir -p "$bundle"
cat > "$bundle/config.json" <<JSON
{"ociVersion":"1.0.2","process":{"user":{"uid":0,"gid":0},"args":["/bin/sleep","1000"],
 "env":["PATH=/bin"],"cwd":"/"},"root":{"path":"$rootfs","readonly":true},"hostname":"bare",
 "mounts":[{"destination":"/proc","type":"proc","source":"proc"}],
 "linux":{"namespaces":[{"type":"pid"},{"type":"ipc"},{"type":"uts"},{"type":"mount"}]}}
JSON
cat > "$scratch/bare.sh" <<'SH'
set -eu
r="runsc --rootless --ignore-cgroups --network=host --root $1/state"
now() { date +%s%N; }
t0=$(now); $r run -detach --bundle "$1" bare; t1=$(now)
$r kill bare KILL; $r delete -force bare; t2=$(now)
echo "$(( (t1 - t0) / 1000000 )) $(( (t2 - t1) / 1000000 ))"
SH
# Round by round, Lazaret then the bare baseline, so that a change in the
# machine's speed during the run falls on both alike.
up=() down=() bare_up=() bare_down=()
for _ in $(seq "$rounds"); do
    t0=$(now); "$lazaret" up bench --workspace "$scratch/project" >/dev/null 2>&1; t1=$(now)
    "$lazaret" down bench --workspace "$scratch/project" >/dev/null; t2=$(now)
    up+=("$(ms "$t0" "$t1")"); down+=("$(ms "$t1" "$t2")")
    read -r u d < <(unshare -Urnm bash "$scratch/bare.sh" "$bundle")
    bare_up+=("$u"); bare_down+=("$d")
done

# Each up's own `runsc run -detach`, as the supervisor logged it: the rest
# of the up is Lazaret's own work, which the ratio's noise (runsc's time
# varies by tens of milliseconds from run to run) hides.
mapfile -t inner < <("$lazaret" logs bench --workspace "$scratch/project" 2>/dev/null |
    grep -o 'runsc run -detach returned elapsed_ms=[0-9]*' | grep -o '[0-9]*$' | tail -n "$rounds")
own=()
for i in "${!inner[@]}"; do own+=($(( up[i] - inner[i] ))); done

mu=$(median "${up[@]}"); md=$(median "${down[@]}")
bu=$(median "${bare_up[@]}"); bd=$(median "${bare_down[@]}")
printf 'rounds: %s\n' "$rounds"
printf 'lazaret up     median %6s ms   bare runsc run -detach   median %6s ms   ratio %s (target <= 1.3)\n' \
    "$mu" "$bu" "$(ratio "$mu" "$bu")"
if [ "${#inner[@]}" -eq "$rounds" ]; then
    printf "  of which     runsc run -detach median %6s ms, the rest (Lazaret's own) median %s ms\n" \
        "$(median "${inner[@]}")" "$(median "${own[@]}")"
fi
printf 'lazaret down   median %6s ms   bare runsc kill+delete   median %6s ms   (target <= 150 ms)\n' "$md" "$bd"
