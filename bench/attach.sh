#!/usr/bin/env bash
# Times `lazaret attach` against a bare `runsc exec` into the same running
# sandbox (entered through the Domain's namespaces), in one run: the time of
# `-- true` (start to exit, the floor under time to first output), of a
# command that does a little work (`sh -c 'ls /'`), and the throughput of
# `-- cat BIGFILE`. Prints medians and ratios.
# The throughput file is large (512 MiB by default) so that the rate, not
# the start-up of a session (which `-- true` measures), decides it: with
# 64 MiB, cat takes about 100 ms, half of it starting.
#
# usage: bench/attach.sh [ROUNDS] [MIB] [CAT_MIB]
#   (default 15 rounds; 64 MiB per session in the ten-session run; 512 MiB
#   for the throughput of cat)
# Run it as the user Lazaret runs as; it uses scratch directories only.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
rounds=${1:-15}
mib=${2:-64}
cat_mib=${3:-512}

bench_setup
bench_host "$scratch"
head -c "$((mib * 1024 * 1024))" /dev/urandom > "$scratch/project/big"
head -c "$((cat_mib * 1024 * 1024))" /dev/urandom > "$scratch/project/bigger"
cd "$scratch/project"
"$lazaret" up bench >/dev/null 2>&1

status=$("$lazaret" status bench --json)
domain_exec
bare=("${exec_cmd[@]}")


# timed ARRAY CMD...: appends the milliseconds CMD takes to ARRAY.
timed() {
    local array=$1 t0 t1
    shift
    t0=$(now)
    "$@"
    t1=$(now)
    eval "$array+=(\$(ms $t0 $t1))"
}
# Each round runs both sides, in turns: Lazaret first in odd rounds, the
# bare baseline first in even ones, so neither always runs on a machine
# the other just warmed (or cooled). The same program, by the same path,
# on both sides.
attach_true=() bare_true=() attach_ls=() bare_ls=()
for round in $(seq "$rounds"); do
    sides=(attach bare)
    (( round % 2 )) || sides=(bare attach)
    for side in "${sides[@]}"; do
        case $side in
        attach)
            timed attach_true "$lazaret" attach bench -- /bin/true </dev/null
            timed attach_ls "$lazaret" attach bench -- /bin/sh -c 'ls / >/dev/null' </dev/null ;;
        bare)
            timed bare_true "${bare[@]}" /bin/true </dev/null
            timed bare_ls "${bare[@]}" /bin/sh -c 'ls / >/dev/null' </dev/null ;;
        esac
    done
done

# MiB/s of reading the throughput file in MS milliseconds.
rate() { echo $(( cat_mib * 1000 / ($1 > 0 ? $1 : 1) )); }
# Standard output is /dev/null, which attach hands to the process as
# runsc exec is handed it; "bare into a pipe" is what any relay of the
# output starts from. Taking turns, as above.
attach_cat=() bare_cat=() bare_pipe=()
for round in $(seq 3); do
    sides=(attach bare)
    (( round % 2 )) || sides=(bare attach)
    for side in "${sides[@]}"; do
        case $side in
        attach) timed attach_cat "$lazaret" attach bench -- /bin/cat /workspace/bigger </dev/null >/dev/null ;;
        bare)
            timed bare_cat "${bare[@]}" /bin/cat /workspace/bigger </dev/null >/dev/null
            timed bare_pipe sh -c '"$@" | cat >/dev/null' sh "${bare[@]}" /bin/cat /workspace/bigger </dev/null ;;
        esac
    done
done

at=$(median "${attach_true[@]}"); bt=$(median "${bare_true[@]}")
al=$(median "${attach_ls[@]}"); bl=$(median "${bare_ls[@]}")
# The rate of the median time is the median rate.
ac=$(rate "$(median "${attach_cat[@]}")"); bc=$(rate "$(median "${bare_cat[@]}")")
bp=$(rate "$(median "${bare_pipe[@]}")")
printf 'rounds: %s (throughput: 3 rounds of %s MiB)\n' "$rounds" "$cat_mib"
printf 'attach -- true      median %6s ms    bare runsc exec  median %6s ms    ratio %s (target <= 1.3)\n' \
    "$at" "$bt" "$(ratio "$at" "$bt")"
printf "attach -- sh -c 'ls /' median %6s ms bare runsc exec  median %6s ms    ratio %s (target <= 1.3)\n" \
    "$al" "$bl" "$(ratio "$al" "$bl")"
printf 'attach -- cat big   median %6s MiB/s bare runsc exec  median %6s MiB/s ratio %s (target >= 0.8)\n' \
    "$ac" "$bc" "$(ratio "$ac" "$bc")"
printf '                                       bare into a pipe median %6s MiB/s ratio %s\n' \
    "$bp" "$(ratio "$ac" "$bp")"

# Ten sessions at once, each relaying 64 MiB of output (to a file, so the
# coordinator relays it rather than handing the process the file), while
# the Host Coordinator's resident memory is sampled.
hc=$(field "['coordinator']['pid']")
rss() { awk '/^VmRSS:/ {print $2}' "/proc/$hc/status"; }
threads() { ls "/proc/$hc/task" | wc -l; }
rss_idle=$(rss); threads_idle=$(threads)
t0=$(now)
pids=()
for n in $(seq 10); do
    "$lazaret" attach bench -- cat /workspace/big </dev/null >"$scratch/out-$n" &
    pids+=($!)
done
rss_peak=$rss_idle threads_peak=$threads_idle
while kill -0 "${pids[@]}" 2>/dev/null; do
    r=$(rss); [ "${r:-0}" -gt "$rss_peak" ] && rss_peak=$r
    t=$(threads); [ "${t:-0}" -gt "$threads_peak" ] && threads_peak=$t
    sleep 0.05
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=$((failed + 1)); done
t1=$(now)
short=0
for n in $(seq 10); do
    [ "$(stat -c %s "$scratch/out-$n")" -eq "$((mib * 1024 * 1024))" ] || short=$((short + 1))
done
printf 'ten sessions x %s MiB relayed: %s ms, %s failed, %s short; HC RSS idle %s KiB, peak %s KiB (target < 16384); HC threads idle %s, peak %s\n' \
    "$mib" "$(ms "$t0" "$t1")" "$failed" "$short" "$rss_idle" "$rss_peak" "$threads_idle" "$threads_peak"
