#!/usr/bin/env bash
# Lets unprivileged users open /dev/net/tun, as desktop distributions do.
#
# slirp4netns, the sandbox's only way out, creates its tap device as the
# invoking user. Desktop distributions ship /dev/net/tun with mode 0666 (a
# tap device made by an unprivileged user lives in that user's own network
# namespace and grants nothing on the host); a host without udev may leave
# it 0600 root, which only root can use. This makes it 0666, saying so.
set -euo pipefail

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

if [ ! -c /dev/net/tun ]; then
    echo "==> /dev/net/tun is missing; loading the tun module"
    as_root modprobe tun || true
fi
if [ ! -c /dev/net/tun ]; then
    echo "/dev/net/tun does not exist and the tun module could not be loaded;" \
        "Lazaret's network (slirp4netns) needs it" >&2
    exit 1
fi
mode=$(stat -c %a /dev/net/tun)
if [ "$mode" != 666 ]; then
    echo "==> /dev/net/tun has mode $mode; making it 0666, as desktop distributions" \
        "ship it, so slirp4netns can run as an unprivileged user"
    as_root chmod 0666 /dev/net/tun
fi
