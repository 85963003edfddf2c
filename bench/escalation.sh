#!/usr/bin/env bash
# Times an auto-approved `lazaret-escalate /usr/bin/true` round trip from
# inside the sandbox (client start, signed request, the coordinator's
# checks and launch, the result back) against running /usr/bin/true
# directly on the host, in the same run, and prints medians and the
# difference.
#
# Each round runs K requests in a loop in one session, and the same loop
# with nothing in it, so the session's own start is subtracted; a round's
# figure is the per-request difference.
#
# usage: bench/escalation.sh [ROUNDS] [K]   (default 7 rounds of 20)
# Run it as the user Lazaret runs as; it uses scratch directories only.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
rounds=${1:-7}
k=${2:-20}

bench_setup
true_path=$(readlink -f /usr/bin/true)
bench_host "$scratch" '[profiles.bench.escalation]' 'enabled = true' \
    "auto_approve = [{ executable = \"$true_path\" }]"
"$lazaret" up bench --workspace "$scratch/project" >/dev/null 2>&1

attach_ms() {
    local t0 t1
    t0=$(now)
    "$lazaret" attach bench --workspace "$scratch/project" -- sh -c "$1" >/dev/null
    t1=$(now)
    echo $(( (t1 - t0) / 1000 ))
}

# One request first, so nothing is cold.
attach_ms "lazaret-escalate $true_path" >/dev/null
escalate=() host=()
for _ in $(seq "$rounds"); do
    with=$(attach_ms "for i in \$(seq $k); do lazaret-escalate $true_path || exit 1; done")
    without=$(attach_ms "for i in \$(seq $k); do :; done")
    escalate+=("$(awk -v a="$with" -v b="$without" -v k="$k" 'BEGIN {printf "%.2f", (a - b) / k / 1000}')")
    t0=$(now)
    for _ in $(seq "$k"); do "$true_path"; done
    t1=$(now)
    host+=("$(awk -v d=$(( (t1 - t0) / 1000 )) -v k="$k" 'BEGIN {printf "%.2f", d / k / 1000}')")
done

me=$(median "${escalate[@]}"); mh=$(median "${host[@]}")
printf 'rounds: %s of %s requests\n' "$rounds" "$k"
printf 'lazaret-escalate %s   median %6s ms per request (round trip from inside the sandbox)\n' "$true_path" "$me"
printf '%s on the host           median %6s ms\n' "$true_path" "$mh"
printf 'overhead                              %6s ms (target <= 15 ms)\n' \
    "$(awk -v a="$me" -v b="$mh" 'BEGIN {printf "%.2f", a - b}')"
