#!/usr/bin/env bash
# build-deb.sh [OUT_DIR]
#
# Builds lazaret_VERSION_ARCH.deb into OUT_DIR (default target/debian) with
# dpkg-deb from the release binaries (built first by packaging/build.sh):
#   /usr/bin/lazaret                          the CLI
#   /usr/libexec/lazaret/lazaret-*            the role binaries, where the CLI
#                                             looks for them (../libexec/lazaret)
#   /usr/share/man/man1/lazaret*.1.gz         a page per command (clap_mangen)
#   bash, zsh and fish completions            where each shell looks
#   /usr/share/lazaret/                       the image build scripts and the
#                                             example configuration
#   /usr/share/doc/lazaret/                   README, docs/ and copyright
# The package never changes device modes: its postinst only says how to make
# /dev/net/tun and /dev/fuse usable where the distribution leaves them 0600.
#
# Needs: dpkg-deb (dpkg), gzip, and what packaging/build.sh needs.
set -euo pipefail
# Every file the package ships is readable by everyone, whatever the
# builder's umask.
umask 022
cd "$(dirname "$0")/.."

out=${1:-target/debian}
for tool in dpkg-deb dpkg gzip; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "error: $tool is missing (apt-get install -y dpkg gzip)" >&2
        exit 1
    fi
done

if [ -z "${LAZARET_SKIP_BUILD:-}" ]; then
    packaging/build.sh
fi
release=target/release
for bin in lazaret lazaret-coordinator lazaret-supervisor lazaret-router lazaret-netsidecar lazaret-resolver; do
    if [ ! -x "$release/$bin" ]; then
        echo "error: $release/$bin is missing; run packaging/build.sh" >&2
        exit 1
    fi
done

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
arch=$(dpkg --print-architecture)
root=$(mktemp -d "${TMPDIR:-/tmp}/lazaret-deb.XXXXXX")
chmod 0755 "$root"
trap 'rm -rf "$root"' EXIT INT TERM

echo "==> laying out lazaret $version ($arch)"
install -d -m 0755 "$root/DEBIAN" "$root/usr/bin" "$root/usr/libexec/lazaret" \
    "$root/usr/share/man/man1" "$root/usr/share/bash-completion/completions" \
    "$root/usr/share/zsh/vendor-completions" "$root/usr/share/fish/vendor_completions.d" \
    "$root/usr/share/lazaret/images" "$root/usr/share/doc/lazaret/docs/roles"
install -m 0755 "$release/lazaret" "$root/usr/bin/lazaret"
for role in lazaret-coordinator lazaret-supervisor lazaret-router lazaret-netsidecar lazaret-resolver; do
    install -m 0755 "$release/$role" "$root/usr/libexec/lazaret/$role"
done
strip --strip-unneeded "$root/usr/bin/lazaret" "$root"/usr/libexec/lazaret/* 2>/dev/null || true

# Man pages and completions come from the binary's own clap definitions.
"$release/lazaret" man-pages "$root/usr/share/man/man1" >/dev/null
gzip -9n "$root"/usr/share/man/man1/*.1
"$release/lazaret" completions bash >"$root/usr/share/bash-completion/completions/lazaret"
"$release/lazaret" completions zsh >"$root/usr/share/zsh/vendor-completions/_lazaret"
"$release/lazaret" completions fish >"$root/usr/share/fish/vendor_completions.d/lazaret.fish"

install -m 0755 packaging/build-busybox-image.sh "$root/usr/share/lazaret/build-busybox-image.sh"
if [ -f packaging/images/build-agent-image.sh ]; then
    install -m 0755 packaging/images/build-agent-image.sh "$root/usr/share/lazaret/images/build-agent-image.sh"
    install -m 0644 packaging/images/README.md "$root/usr/share/lazaret/images/README.md"
fi
install -m 0644 packaging/examples/busybox.toml "$root/usr/share/lazaret/busybox.toml"
install -m 0755 packaging/device-access.sh "$root/usr/share/lazaret/device-access.sh"

install -m 0644 README.md "$root/usr/share/doc/lazaret/README.md"
install -m 0644 docs/*.md "$root/usr/share/doc/lazaret/docs/"
install -m 0644 docs/roles/*.md "$root/usr/share/doc/lazaret/docs/roles/"
cat >"$root/usr/share/doc/lazaret/copyright" <<'COPYRIGHT'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: lazaret

Files: *
License: Apache-2.0
 On Debian systems, the full text of the Apache License 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
COPYRIGHT

size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<CONTROL
Package: lazaret
Version: $version
Architecture: $arch
Maintainer: Lazaret developers <lazaret@localhost>
Installed-Size: $size
Section: devel
Priority: optional
Depends: runsc, slirp4netns, util-linux, procps
Recommends: busybox-static, umoci, skopeo, git, man-db, bash-completion
Description: run an AI coding agent on your project inside a gVisor sandbox
 Lazaret starts a rootless gVisor sandbox for a project (lazaret up), opens
 sessions in it (lazaret attach), asks the developer before running a
 command on the host (escalation), keeps the sandbox's tools between runs,
 hides the project's git-ignored secrets and git hooks from it, and lets it
 reach only the IPv4 prefixes its profile allows.
CONTROL

# The postinst only informs: the device modes are the administrator's call.
cat >"$root/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    for dev in /dev/net/tun /dev/fuse; do
        if [ -e "$dev" ] && [ "$(stat -c %a "$dev")" != 666 ]; then
            echo "lazaret: $dev is mode $(stat -c %a "$dev"); Lazaret needs it usable by" >&2
            echo "  the user who runs it (slirp4netns opens /dev/net/tun, the Workspace" >&2
            echo "  Router /dev/fuse). Desktop distributions ship both 0666; to do the same:" >&2
            echo "  sudo sh /usr/share/lazaret/device-access.sh" >&2
        fi
    done
fi
exit 0
POSTINST
chmod 0755 "$root/DEBIAN/postinst"

mkdir -p "$out"
deb="$out/lazaret_${version}_${arch}.deb"
dpkg-deb --root-owner-group --build "$root" "$deb" >/dev/null
echo "built $deb"
