#!/usr/bin/env bash
# Installs gVisor's runsc with the systrap platform (runsc 2023 and later).
#
# Lazaret runs the sandbox on systrap wherever runsc offers it: there each
# process inside costs the host about two tasks, from a pool that stops
# growing, so the sandbox's bound of 512 processes per uid fits inside the
# Domain's bound of 8,192 host tasks. The older ptrace platform, the only
# one of Debian bookworm's runsc (2022-12-19), leaks host threads with every
# process started inside until the sandbox ends
# (docs/threat-model.md, "How many processes a Domain holds").
#
# Where the distribution's own runsc already has systrap (Debian 13 and
# later), that is installed. On Debian bookworm, runsc comes from Debian's
# own bookworm-backports suite, added as a source of its own beside the
# machine's Debian source (same mirror and key); backports are never taken
# for other packages unless asked for.
set -euo pipefail

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

has_systrap() {
    command -v runsc >/dev/null && runsc flags 2>&1 | grep -A1 -- '-platform string' | grep -q systrap
}

if has_systrap; then
    echo "==> runsc offers systrap: $(runsc --version | head -1)"
    exit 0
fi

codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
candidate=$(apt-cache policy runsc | awk '/Candidate:/ {print $2}')
# Debian's runsc versions are 0.0~YYYYMMDD...; systrap came in 2023.
if [ -n "$candidate" ] && [ "$candidate" != "(none)" ] &&
    dpkg --compare-versions "$candidate" ge 0.0~20230101; then
    echo "==> installing runsc $candidate"
    as_root apt-get install -y -q --no-install-recommends runsc
elif [ "$codename" = bookworm ]; then
    # The machine's own Debian mirror: the first source (deb822 first, then
    # one-line) whose suite is bookworm itself, not security, backports or
    # another vendor's repository.
    mirror=$({ cat /etc/apt/sources.list.d/*.sources 2>/dev/null || true; } |
        awk '/^URIs:/ {uri=$2} /^Suites:/ {for (i = 2; i <= NF; i++) if ($i == "bookworm") print uri}' |
        grep -oE '^https?://[^ ]+' | head -1 || true)
    if [ -z "$mirror" ]; then
        mirror=$({ cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true; } |
            awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/ && $(i + 1) == "bookworm") print $i}' |
            head -1 || true)
    fi
    mirror=${mirror:-http://deb.debian.org/debian}
    echo "==> adding Debian's bookworm-backports ($mirror) for runsc with systrap"
    as_root tee /etc/apt/sources.list.d/lazaret-bookworm-backports.sources >/dev/null <<EOF
Types: deb
URIs: ${mirror%/}
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    as_root apt-get update -q
    as_root apt-get install -y -q --no-install-recommends -t bookworm-backports runsc
else
    echo "this distribution's runsc (${candidate:-none}) has no systrap platform;" \
        "install runsc 2023 or later from gVisor's releases," \
        "or Lazaret runs the sandbox on ptrace, whose host threads grow with every" \
        "process started inside" >&2
    exit 1
fi

if ! has_systrap; then
    echo "the installed runsc still offers no systrap platform: $(runsc --version | head -1)" >&2
    exit 1
fi
echo "==> runsc offers systrap: $(runsc --version | head -1)"
