#!/usr/bin/env bash
# Times file work inside /workspace of a Lazaret sandbox against the same
# work in a bare rootless runsc sandbox whose /workspace is a plain bind
# mount, in one run: creating 5,000 small files in nested directories,
# stating and reading them back, `find | wc -l`, and writing then reading
# one 256 MiB file. Lazaret runs twice: with `isolate_gitignored = true`
# (the default; the workspace is a git repository with ignore rules) and
# with `false`. The work runs through `runsc exec` in every case, so only
# the filesystem differs; the time of an empty `runsc exec` (measured in
# the same run, per sandbox) is subtracted from each phase. The three
# sandboxes run side by side and take turns phase by phase, so a machine
# whose speed drifts during the run slows all three alike. Prints medians
# and ratios against the bind mount.
#
# usage: bench/workspace.sh [ROUNDS] [FILES] [MIB]   (default 3, 5000, 256)
# Run it as the user Lazaret runs as; it uses scratch directories only.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
rounds=${1:-3}
files=${2:-5000}
mib=${3:-256}

bench_setup bench shared
bench_host "$scratch" \
    '[profiles.shared]' "image = \"oci:$scratch/image:latest\"" 'isolate_gitignored = false'
cd "$scratch/project"
git init -q .
printf 'node_modules/\n*.log\n__pycache__/\ntarget/\n.env\n' > .gitignore

# The work, run inside a sandbox by `sh -c` with the phase and directory.
cat > "$scratch/work.sh" <<'SH'
set -eu
phase=$1 dir=$2 files=$3 mib=$4
leaves=$((files / 10))
case $phase in
create)
    mkdir -p "$dir"
    i=0
    while [ $i -lt $leaves ]; do
        d=$dir/d$((i / 10))/s$((i % 10))
        mkdir -p "$d"
        for f in 0 1 2 3 4 5 6 7 8 9; do echo "file $i $f" > "$d/f$f"; done
        i=$((i + 1))
    done ;;
stat) ls -lR "$dir" > /dev/null ;;
read) find "$dir" -type f | xargs cat > /dev/null ;;
find) find "$dir" | wc -l > /dev/null ;;
warm) dd if=/dev/zero of="$dir.warm" bs=1M count="$mib" 2>/dev/null; rm "$dir.warm" ;;
write) dd if=/dev/zero of="$dir.big" bs=1M count="$mib" 2>/dev/null ;;
readbig) dd if="$dir.big" of=/dev/null bs=1M 2>/dev/null ;;
floor) : ;;
clean) rm -rf "$dir" "$dir.big" ;;
esac
SH
work=$(cat "$scratch/work.sh")

phases=(floor create stat read find write readbig)
variants=(bare routed shared)

# Lazaret, through runsc exec in the Domain's namespaces: exec_routed
# (the default, isolating the ignored paths) and exec_shared.
"$lazaret" up bench >/dev/null 2>&1
status=$("$lazaret" status bench --json)
domain_exec
exec_routed=("${exec_cmd[@]}")
# The dentry cache Lazaret sized for its sandbox, which the bare one gets too
# (runsc orders the sandbox's flags differently from one start to the next).
sandbox=$(pgrep -n -f -- "runsc-sandbox .*--root=$(field "['runsc_root']")( |$)")
dcache=$(tr '\0' '\n' < "/proc/$sandbox/cmdline" | grep -- '^--dcache=')
"$lazaret" up shared >/dev/null 2>&1
status=$("$lazaret" status shared --json)
domain_exec
exec_shared=("${exec_cmd[@]}")

# The bare baseline: the same unpacked image and runsc flags, rootless
# runsc in a fresh user, mount and network namespace (held by a sleeping
# shell), with /workspace a plain bind mount.
rootfs=$(ls -d "$HOME"/.local/share/lazaret/catalog/artifacts/*/rootfs | head -n 1)
mkdir -p "$scratch/bare" "$scratch/bare-workspace"
cat > "$scratch/bare/config.json" <<JSON
{"ociVersion":"1.0.2","process":{"user":{"uid":0,"gid":0},"args":["/bin/sleep","100000"],
 "env":["PATH=/bin"],"cwd":"/"},"root":{"path":"$rootfs","readonly":true},"hostname":"bare",
 "mounts":[{"destination":"/proc","type":"proc","source":"proc"},
  {"destination":"/tmp","type":"tmpfs","source":"tmpfs"},
  {"destination":"/workspace","type":"bind","source":"$scratch/bare-workspace","options":["rbind","rw"]}],
 "linux":{"namespaces":[{"type":"pid"},{"type":"ipc"},{"type":"uts"},{"type":"mount"}]}}
JSON
bare_runsc=(runsc --rootless --ignore-cgroups --network=host "$dcache" --root "$scratch/bare/state")
# bare_stop: ends the bare sandbox and the shell that holds its namespaces.
bare_stop() {
    local in_ns=(nsenter -t "$bare_holder" -U -m -n --preserve-credentials --)
    "${in_ns[@]}" "${bare_runsc[@]}" kill bare KILL >/dev/null 2>&1 || true
    "${in_ns[@]}" "${bare_runsc[@]}" delete -force bare >/dev/null 2>&1 || true
    kill "$bare_holder" 2>/dev/null || true
    wait "$bare_holder" 2>/dev/null || true
}
unshare -Urnm bash -c "${bare_runsc[*]} run -detach --bundle $scratch/bare bare && echo started && exec sleep 100000" \
    > "$scratch/bare/holder.out" 2>&1 &
bare_holder=$!
trap 'bare_stop; bench_cleanup' EXIT
for _ in $(seq 300); do
    grep -q started "$scratch/bare/holder.out" && break
    kill -0 "$bare_holder" 2>/dev/null || { cat "$scratch/bare/holder.out" >&2; exit 1; }
    sleep 0.1
done
grep -q started "$scratch/bare/holder.out" || { echo "the bare sandbox did not start within 30 s" >&2; exit 1; }
exec_bare=(nsenter -t "$bare_holder" -U -m -n --preserve-credentials -- "${bare_runsc[@]}" exec bare)

# Round by round, phase by phase, each workspace in turn (which goes first
# changes from round to round), so that a change in the machine's speed
# during the run falls on all three alike. Before each phase the host
# writes back what the last one left dirty and the sandboxes settle, so no
# phase pays for the one before it. Before the big write, each sandbox
# writes and removes a file as big, untimed: on a virtual machine that
# hands freed memory back to its host (a balloon's free page reporting),
# the first write into such memory costs a fault in the host for every
# page, and without the warm-up whichever sandbox wrote after the longest
# pause would pay for it. Each time goes to the array VARIANT_PHASE, in
# milliseconds.
for round in $(seq "$rounds"); do
    shift_by=$(( (round - 1) % ${#variants[@]} ))
    order=("${variants[@]:shift_by}" "${variants[@]:0:shift_by}")
    for phase in "${phases[@]}" clean; do
        for variant in "${order[@]}"; do
            eval "cmd=(\"\${exec_${variant}[@]}\")"
            if [ "$phase" = write ]; then
                "${cmd[@]}" /bin/sh -c "$work" sh warm "/workspace/w$round" "$files" "$mib" </dev/null
            fi
            sync
            sleep 0.5
            t0=$(now)
            "${cmd[@]}" /bin/sh -c "$work" sh "$phase" "/workspace/w$round" "$files" "$mib" </dev/null
            t1=$(now)
            eval "${variant}_${phase}+=(\$(ms $t0 $t1))"
        done
    done
done

printf 'rounds: %s; %s files in %s directories; one %s MiB file\n' \
    "$rounds" "$files" "$((files / 10 + files / 100))" "$mib"
bf=$(median "${bare_floor[@]}"); rf=$(median "${routed_floor[@]}"); sf=$(median "${shared_floor[@]}")
printf 'an empty runsc exec (subtracted below): bind %s ms, routed %s ms, shared %s ms\n' "$bf" "$rf" "$sf"
net() { local t=$(( $1 - $2 )); echo $(( t > 1 ? t : 1 )); }
printf '%-9s %12s %12s %12s %10s %10s\n' phase "bind (ms)" "routed (ms)" "shared (ms)" routed/bind shared/bind
for phase in "${phases[@]:1}"; do
    eval "b=\$(median \"\${bare_${phase}[@]}\"); r=\$(median \"\${routed_${phase}[@]}\"); s=\$(median \"\${shared_${phase}[@]}\")"
    b=$(net "$b" "$bf"); r=$(net "$r" "$rf"); s=$(net "$s" "$sf")
    printf '%-9s %12s %12s %12s %10s %10s\n' "$phase" "$b" "$r" "$s" "$(ratio "$r" "$b")" "$(ratio "$s" "$b")"
done
echo "targets: create, stat, read and find within 1.5x of the bind mount (time ratio <= 1.5);"
echo "         write and readbig at least 0.8x its throughput (time ratio <= 1.25)"
