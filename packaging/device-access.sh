#!/usr/bin/env bash
# Lets unprivileged users open /dev/net/tun and /dev/fuse, as desktop
# distributions do.
#
# - /dev/net/tun: slirp4netns, the sandbox's only way out, creates its tap
#   device as the invoking user. A tap device made by an unprivileged user
#   lives in that user's own network namespace and grants nothing on the
#   host.
# - /dev/fuse: the Workspace Router serves the sandbox's /workspace over
#   FUSE, mounted inside the Domain's own user and mount namespaces. Such a
#   mount is visible only there and grants nothing on the host; the kernel
#   allows it to any user who can open the device.
#
# Desktop distributions ship both with mode 0666; a host without udev may
# leave them 0600 root, which only root can use. This makes them 0666,
# saying so.
set -euo pipefail

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# open_to_users DEVICE MODULE WHY
open_to_users() {
    local device=$1 module=$2 why=$3
    if [ ! -c "$device" ]; then
        echo "==> $device is missing; loading the $module module"
        as_root modprobe "$module" || true
    fi
    if [ ! -c "$device" ]; then
        echo "$device does not exist and the $module module could not be loaded;" \
            "Lazaret needs it: $why" >&2
        exit 1
    fi
    local mode
    mode=$(stat -c %a "$device")
    if [ "$mode" != 666 ]; then
        echo "==> $device has mode $mode; making it 0666, as desktop distributions" \
            "ship it, because $why"
        as_root chmod 0666 "$device"
    fi
}

open_to_users /dev/net/tun tun "slirp4netns creates the sandbox's tap device as the invoking user"
open_to_users /dev/fuse fuse "the Workspace Router serves /workspace over FUSE as the invoking user"
