#!/usr/bin/env bash
# Times file work inside /workspace of a Lazaret sandbox against the same
# work in a bare rootless runsc sandbox whose /workspace is a plain bind
# mount, in one run: creating 5,000 small files in nested directories,
# stating and reading them back, `find | wc -l`, and writing then reading
# one 256 MiB file. Lazaret runs twice: with `isolate_gitignored = true`
# (the default; the workspace is a git repository with ignore rules) and
# with `false`. The work runs through `runsc exec` in every case, so only
# the filesystem differs; the time of an empty `runsc exec` (measured in
# the same run, per sandbox) is subtracted from each phase. Prints medians
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
write) dd if=/dev/zero of="$dir.big" bs=1M count="$mib" 2>/dev/null ;;
readbig) dd if="$dir.big" of=/dev/null bs=1M 2>/dev/null ;;
floor) : ;;
clean) rm -rf "$dir" "$dir.big" ;;
esac
SH
work=$(cat "$scratch/work.sh")

phases=(floor create stat read find write readbig)

# run_phases LABEL EXEC...: runs each phase ROUNDS times through EXEC (a
# command that runs `sh -c SCRIPT ARGS` inside), recording milliseconds in
# the arrays LABEL_PHASE.
run_phases() {
    local label=$1
    shift
    local round phase t0 t1
    for round in $(seq "$rounds"); do
        for phase in "${phases[@]}"; do
            t0=$(now)
            "$@" /bin/sh -c "$work" sh "$phase" "/workspace/w$round" "$files" "$mib" </dev/null
            t1=$(now)
            eval "${label}_${phase}+=(\$(ms $t0 $t1))"
        done
        "$@" /bin/sh -c "$work" sh clean "/workspace/w$round" "$files" "$mib" </dev/null
    done
}

# Lazaret, through runsc exec in the Domain's namespaces.
lazaret_exec() {
    "$lazaret" up "$1" >/dev/null 2>&1
    status=$("$lazaret" status "$1" --json)
    domain_exec
}
lazaret_exec bench
run_phases routed "${exec_cmd[@]}"
"$lazaret" down bench >/dev/null
lazaret_exec shared
run_phases shared "${exec_cmd[@]}"
"$lazaret" down shared >/dev/null

# The bare baseline: the same unpacked image, rootless runsc in a fresh
# user, mount and network namespace, /workspace a plain bind mount.
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
# Inside one `unshare`: start the bare sandbox, run the phases, stop it.
export -f run_phases now ms
phase_names="${phases[*]}"
export rounds files mib scratch work phase_names
bare_out=$(unshare -Urnm bash -c '
    set -eu
    read -ra phases <<<"$phase_names"
    r="runsc --rootless --ignore-cgroups --network=host --root $scratch/bare/state"
    $r run -detach --bundle "$scratch/bare" bare
    run_phases bare $r exec bare
    $r kill bare KILL; $r delete -force bare
    for p in "${phases[@]}"; do eval "echo $p \${bare_${p}[*]}"; done
')
while read -r phase values; do
    eval "bare_${phase}=($values)"
done <<<"$bare_out"

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
