#!/usr/bin/env bash
# test-deb.sh DEB
#
# Installs DEB with apt-get as a user would (apt-get install ./lazaret_*.deb),
# then checks what the package promises: `lazaret` on PATH finds its role
# binaries in /usr/libexec/lazaret and runs a Domain (up, attach, down) on
# the busybox image its own script builds; `man lazaret-up` renders; bash
# completion completes; zsh and fish completions are where those shells
# look. Removes the package at the end. Run as root on a machine where
# Lazaret's packages are installable (CI).
set -euo pipefail

deb=$(realpath "$1")
export DEBIAN_FRONTEND=noninteractive
fail() { echo "test-deb: $*" >&2; exit 1; }

echo "==> apt-get install $deb"
scratch=$(mktemp -d /tmp/lazaret-deb-test.XXXXXX)
cleanup() {
    # The Domain first, whatever failed, then the package and the scratch.
    (cd "$scratch/project" 2>/dev/null &&
        HOME=$scratch/home XDG_RUNTIME_DIR=$scratch/run lazaret down default >/dev/null 2>&1) || true
    apt-get remove -y -q lazaret >/dev/null 2>&1 || true
    rm -rf "$scratch"
}
trap cleanup EXIT
apt-get install -y -q "$deb"

[ "$(command -v lazaret)" = /usr/bin/lazaret ] || fail "lazaret is not /usr/bin/lazaret"
lazaret --version | grep -q '^lazaret ' || fail "lazaret --version"
for role in coordinator supervisor router netsidecar resolver; do
    [ -x "/usr/libexec/lazaret/lazaret-$role" ] || fail "lazaret-$role is not installed"
done

echo "==> man lazaret-up"
page=$(MANPAGER=cat MANWIDTH=80 man lazaret-up)
grep -q 'lazaret-up' <<<"$page" || fail "man lazaret-up shows no page: $page"
grep -q 'PROFILE' <<<"$page" || fail "man lazaret-up does not name PROFILE"
MANPAGER=cat man lazaret-state-reset >/dev/null || fail "man lazaret-state-reset"

echo "==> bash completion"
words=$(bash -c 'source /usr/share/bash-completion/completions/lazaret
    COMP_WORDS=(lazaret st); COMP_CWORD=1; _lazaret lazaret; printf "%s\n" "${COMPREPLY[@]}"')
grep -qx status <<<"$words" || fail "bash completion of 'lazaret st' gave: $words"
[ -s /usr/share/zsh/vendor-completions/_lazaret ] || fail "no zsh completion"
[ -s /usr/share/fish/vendor_completions.d/lazaret.fish ] || fail "no fish completion"

echo "==> a Domain from the installed package"
export HOME=$scratch/home XDG_RUNTIME_DIR=$scratch/run
mkdir -p "$HOME/.config/lazaret" "$scratch/project"
install -d -m 0700 "$XDG_RUNTIME_DIR"
bash /usr/share/lazaret/build-busybox-image.sh "$scratch/images/busybox" latest >/dev/null
sed "s|/usr/local/share/lazaret/images/busybox|$scratch/images/busybox|" \
    /usr/share/lazaret/busybox.toml >"$HOME/.config/lazaret/config.toml"
chmod 0600 "$HOME/.config/lazaret/config.toml"
cd "$scratch/project"
lazaret up default --quiet
out=$(lazaret attach default -- sh -c 'echo installed-$((6*7))')
lazaret down default >/dev/null
[ "$out" = installed-42 ] || fail "attach said: $out"
echo "==> the package works"
