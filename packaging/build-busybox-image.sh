#!/bin/sh
# build-busybox-image.sh DEST_LAYOUT_DIR [TAG]
#
# Builds a small OCI image from Debian's busybox-static into the OCI image
# layout DEST_LAYOUT_DIR (created if missing; an existing layout gains or
# replaces TAG, default "latest"), for use as `image = "oci:DEST_LAYOUT_DIR:TAG"`
# where no registry is reachable.
#
# The root filesystem holds /bin/busybox (a real copy of the static binary),
# a symbolic link in /bin for every other applet, /usr/bin, /usr/sbin and
# /sbin as links to /bin, the directories /root /tmp /etc /proc /sys /dev
# /workspace /run, and an /etc/passwd and /etc/group naming root. The image
# runs /bin/sh in /workspace with PATH=/bin.
#
# Needs: busybox-static (apt-get install -y busybox-static) and umoci
# (apt-get install -y umoci). Works as root and as an unprivileged user
# (umoci runs rootless either way). Set BUSYBOX to use another static
# busybox binary, and LAZARET_IMAGE_EXTRA to a directory to copy over the
# root filesystem.
set -eu

usage() {
    echo "usage: $0 DEST_LAYOUT_DIR [TAG]" >&2
    exit 2
}

[ $# -ge 1 ] && [ $# -le 2 ] || usage
dest=$1
tag=${2:-latest}
busybox=${BUSYBOX:-/bin/busybox}

case $tag in
    *[!A-Za-z0-9._-]* | "" | [._-]*)
        echo "error: tag '$tag' must be letters, digits, '.', '_' and '-', not starting with a separator" >&2
        exit 2
        ;;
esac
if [ ! -x "$busybox" ]; then
    echo "error: $busybox is missing; install Debian's busybox-static (apt-get install -y busybox-static)" >&2
    exit 1
fi
# ldd(1) succeeds only on a dynamically linked executable.
if command -v ldd >/dev/null 2>&1 && ldd "$busybox" >/dev/null 2>&1; then
    echo "error: $busybox is dynamically linked; the image needs a static one (apt-get install -y busybox-static)" >&2
    exit 1
fi
if ! command -v umoci >/dev/null 2>&1; then
    echo "error: umoci is missing (apt-get install -y umoci)" >&2
    exit 1
fi

if [ -e "$dest/index.json" ]; then
    : # an existing layout: add or replace the tag
elif [ -e "$dest" ] && [ -n "$(ls -A "$dest" 2>/dev/null)" ]; then
    echo "error: $dest exists and is not an OCI image layout" >&2
    exit 1
else
    [ -d "$dest" ] && rmdir "$dest"
    umoci init --layout "$dest"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/lazaret-busybox.XXXXXX")
cleanup() {
    # umoci's rootless unpack may leave directories without write bits.
    chmod -R u+rwX "$work" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

umoci new --image "$dest:$tag"
umoci unpack --rootless --image "$dest:$tag" "$work/bundle"
rootfs=$work/bundle/rootfs

mkdir -p "$rootfs/bin" "$rootfs/usr" "$rootfs/etc" "$rootfs/proc" "$rootfs/sys" \
    "$rootfs/dev" "$rootfs/workspace" "$rootfs/run" "$rootfs/root" "$rootfs/tmp"
chmod 0755 "$rootfs/bin" "$rootfs/usr" "$rootfs/etc" "$rootfs/proc" "$rootfs/sys" \
    "$rootfs/dev" "$rootfs/workspace" "$rootfs/run"
chmod 0700 "$rootfs/root"
chmod 1777 "$rootfs/tmp"

cp "$busybox" "$rootfs/bin/busybox"
chmod 0755 "$rootfs/bin/busybox"
# `busybox --list` names busybox itself: never replace the binary by a link.
for applet in $("$rootfs/bin/busybox" --list); do
    case $applet in
        busybox | */* | "") continue ;;
    esac
    [ -e "$rootfs/bin/$applet" ] || [ -L "$rootfs/bin/$applet" ] || ln -s busybox "$rootfs/bin/$applet"
done
ln -s bin "$rootfs/sbin"
ln -s ../bin "$rootfs/usr/bin"
ln -s ../bin "$rootfs/usr/sbin"

cat >"$rootfs/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/bin/sh
PASSWD
cat >"$rootfs/etc/group" <<'GROUP'
root:x:0:
GROUP
chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group"

# LAZARET_IMAGE_EXTRA: a directory whose contents are copied over the root
# filesystem (tests use it to make images that differ).
if [ -n "${LAZARET_IMAGE_EXTRA:-}" ]; then
    cp -a "$LAZARET_IMAGE_EXTRA/." "$rootfs/"
fi

umoci repack --image "$dest:$tag" "$work/bundle"
umoci config --image "$dest:$tag" \
    --config.cmd /bin/sh \
    --config.env PATH=/bin:/usr/bin:/sbin:/usr/sbin \
    --config.env HOME=/root \
    --config.workingdir /workspace \
    --history.created_by "lazaret build-busybox-image.sh"
umoci gc --layout "$dest"
echo "built oci:$(cd "$dest" && pwd):$tag"
