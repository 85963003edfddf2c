#!/usr/bin/env bash
# build-agent-image.sh AGENT DEST_LAYOUT_DIR [TAG]
#
# Builds an OCI image for running a coding agent under Lazaret into the OCI
# image layout DEST_LAYOUT_DIR (created if missing; an existing layout gains
# or replaces TAG, default AGENT), for use as
# `image = "oci:DEST_LAYOUT_DIR:TAG"`. README.md beside this script says
# what each agent needs at run time.
#
# AGENT is one of:
#   base      Debian with bash, git, curl, python3, nodejs and npm; no agent
#   claude    base + npm @anthropic-ai/claude-code
#   codex     base + npm @openai/codex
#   gemini    base + npm @google/gemini-cli
#   opencode  base + npm opencode-ai
#
# The image has one or two layers: a Debian root filesystem made by
# mmdebstrap (variant minbase, suite DEBIAN_SUITE below, from the Debian
# mirror this machine's apt uses), then, for an agent, /usr/local as
# `npm install --global` left it (the agent's platform binaries are the
# build machine's: x86_64 or aarch64). It runs /bin/bash in /workspace as
# root with HOME=/root and LANG=C.UTF-8. With LAZARET_BASE_ROOTFS set to a
# tarball built before, nothing here needs root or mmdebstrap.
#
# Needs: mmdebstrap (apt-get install -y mmdebstrap) and umoci
# (apt-get install -y umoci); for an agent also Node.js >= 18 and npm
# (apt-get install -y nodejs npm, unless a Node.js with its own npm is
# there already). As root mmdebstrap runs in its root mode;
# as another user in its unshare mode, which needs newuidmap
# (apt-get install -y uidmap), subordinate ids for that user in /etc/subuid
# and /etc/subgid, and unprivileged user namespaces.
#
# Environment:
#   LAZARET_AGENT_VERSION   the agent's npm version instead of the pinned one
#   LAZARET_BASE_ROOTFS     a tarball of the base root filesystem: used when
#                           it exists (built by this script, same suite and
#                           packages), else built and saved there, so base
#                           and agent images share one mmdebstrap run (and,
#                           in one layout, one base layer blob)
#   LAZARET_DEBIAN_SUITE    another Debian suite (default below)
#   LAZARET_DEBIAN_MIRROR   the Debian archive URI (default: the one this
#                           machine's apt uses, as `apt-get update` last
#                           saw it, else mmdebstrap's default)
#   LAZARET_DEBIAN_SECURITY_MIRROR  the same for the security archive
# apt's proxy settings (Acquire::http::Proxy, Acquire::https::Proxy) and
# Acquire::Check-Valid-Until are passed on to mmdebstrap, and the proxy to
# npm when npm has none of its own; neither ends up in the image. npm runs
# on this machine with its own configuration (registry, proxy, cafile).
set -euo pipefail
umask 022

# Pinned inputs. trixie's nodejs (20.x) runs every agent below: gemini-cli
# wants Node.js >= 20; claude-code declares >= 22 but is a native binary
# that Node.js only installs.
DEBIAN_SUITE=${LAZARET_DEBIAN_SUITE:-trixie}
DEBIAN_VARIANT=minbase
DEBIAN_PACKAGES=bash,ca-certificates,curl,git,less,netbase,nodejs,npm,procps,python3,ripgrep
CLAUDE_VERSION=2.1.332
CODEX_VERSION=0.171.0
GEMINI_VERSION=0.61.0
OPENCODE_VERSION=1.18.33
# The packages whose versions are reported.
REPORTED_PACKAGES="bash ca-certificates curl git nodejs npm python3"

usage() {
    echo "usage: $0 AGENT DEST_LAYOUT_DIR [TAG]" >&2
    echo "  AGENT: base, claude, codex, gemini or opencode; TAG defaults to AGENT" >&2
    exit 2
}

if [ $# -lt 2 ] || [ $# -gt 3 ]; then usage; fi
agent=$1
dest=$2
tag=${3:-$agent}

case $agent in
    base) package='' version='' ;;
    claude) package=@anthropic-ai/claude-code version=$CLAUDE_VERSION ;;
    codex) package=@openai/codex version=$CODEX_VERSION ;;
    gemini) package=@google/gemini-cli version=$GEMINI_VERSION ;;
    opencode) package=opencode-ai version=$OPENCODE_VERSION ;;
    *)
        echo "error: unknown agent '$agent'" >&2
        usage
        ;;
esac
if [ -n "$package" ]; then
    version=${LAZARET_AGENT_VERSION:-$version}
    case $version in
        *[!A-Za-z0-9.+-]* | "")
            echo "error: LAZARET_AGENT_VERSION '$version' is not an npm version" >&2
            exit 2
            ;;
    esac
fi
case $tag in
    *[!A-Za-z0-9._-]* | "" | [._-]*)
        echo "error: tag '$tag' must be letters, digits, '.', '_' and '-', not starting with a separator" >&2
        exit 2
        ;;
esac
case $DEBIAN_SUITE in
    *[!a-z0-9-]* | "")
        echo "error: LAZARET_DEBIAN_SUITE '$DEBIAN_SUITE' is not a Debian suite name" >&2
        exit 2
        ;;
esac

need() {
    if ! command -v "$1" >/dev/null 2>&1; then
        echo "error: $1 is missing (apt-get install -y $2)" >&2
        exit 1
    fi
}
need umoci umoci
need tar tar
need dpkg-query dpkg
need apt-config apt

base_tar=${LAZARET_BASE_ROOTFS:-}
if [ -z "$base_tar" ] || [ ! -s "$base_tar" ]; then
    need mmdebstrap mmdebstrap
    if [ "$(id -u)" -eq 0 ]; then
        mode=root
    else
        mode=unshare
        need newuidmap uidmap
        me=$(id -un)
        if ! grep -q "^\($me\|$(id -u)\):" /etc/subuid 2>/dev/null ||
            ! grep -q "^\($me\|$(id -u)\):" /etc/subgid 2>/dev/null; then
            echo "error: building as $me (not root) uses mmdebstrap --mode=unshare, which needs subordinate ids:" >&2
            echo "  run as root: usermod --add-subuids 100000-165535 --add-subgids 100000-165535 $me" >&2
            echo "  (or build as root, or set LAZARET_BASE_ROOTFS to a base tarball built before)" >&2
            exit 1
        fi
    fi
fi

if [ -n "$package" ]; then
    need node nodejs
    need npm npm
    node_major=$(node -p 'process.versions.node.split(".")[0]')
    if [ "$node_major" -lt 18 ]; then
        echo "error: Node.js $(node --version) is too old to install $package; need >= 18 (apt-get install -y nodejs npm: Debian bookworm or later)" >&2
        exit 1
    fi
    case $(uname -m) in
        x86_64 | aarch64) ;;
        *)
            echo "error: $package ships binaries for x86_64 and aarch64 only, and this machine is $(uname -m)" >&2
            exit 1
            ;;
    esac
fi

if [ -e "$dest/index.json" ]; then
    : # an existing layout: add or replace the tag
elif [ -e "$dest" ] && [ -n "$(ls -A "$dest" 2>/dev/null)" ]; then
    echo "error: $dest exists and is not an OCI image layout" >&2
    exit 1
else
    if [ -d "$dest" ]; then rmdir "$dest"; fi
    umoci init --layout "$dest"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/lazaret-agent-image.XXXXXX")
cleanup() {
    chmod -R u+rwX "$work" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The value apt has for option $1 on this machine, or nothing.
apt_option() {
    local value=
    eval "$(apt-config shell value "$1")"
    printf '%s' "$value"
}

# The archive URI of the first apt source of this machine with Release
# label $1 ("Debian", "Debian-Security"), or nothing.
apt_mirror() {
    # shellcheck disable=SC2016 # apt's own $(FIELD) syntax
    { apt-get indextargets --format '$(REPO_URI) $(LABEL)' 'Created-By: Packages' 2>/dev/null || true; } |
        awk -v label="$1" '$2 == label && !found { print $1; found = 1 }'
}

marker="suite=$DEBIAN_SUITE variant=$DEBIAN_VARIANT packages=$DEBIAN_PACKAGES"

build_base() {
    local out=$1 mirror security opt value hook
    local -a args=(--mode="$mode" --variant="$DEBIAN_VARIANT" --format=tar --skip=output/dev
        --include="$DEBIAN_PACKAGES"
        --dpkgopt='path-exclude=/usr/share/man/*'
        --dpkgopt='path-exclude=/usr/share/info/*'
        --dpkgopt='path-exclude=/usr/share/doc/*'
        --dpkgopt='path-include=/usr/share/doc/*/copyright'
        --dpkgopt='path-exclude=/usr/share/locale/*'
        --dpkgopt='path-include=/usr/share/locale/locale.alias'
        --dpkgopt='path-exclude=/usr/share/lintian/*')
    for opt in Acquire::http::Proxy Acquire::https::Proxy Acquire::Check-Valid-Until; do
        value=$(apt_option "$opt")
        if [ -n "$value" ]; then
            echo "apt option from this machine: $opt \"$value\""
            args+=(--aptopt="$opt \"$value\"")
        fi
    done
    # What the image should be like, done before mmdebstrap's own cleanup
    # (which empties /run and /tmp and removes apt's lists and caches). The
    # hook runs as root in the chroot's namespaces: no device node is touched
    # here, since /dev may be the host's; the tarball loses them below.
    # shellcheck disable=SC2016 # expanded by the hook's shell
    hook='set -e; r=$1
rm -f "$r/etc/apt/apt.conf.d/99mmdebstrap" "$r/etc/resolv.conf" "$r/etc/hostname"
rm -f "$r"/var/cache/debconf/*-old "$r"/var/lib/dpkg/*-old
find "$r/var/log" -type f -delete
printf "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" >"$r/etc/hosts"
mkdir -p "$r/workspace" "$r/run" "$r/root" "$r/tmp"
chmod 0755 "$r/workspace" "$r/run"
chmod 0700 "$r/root"
chmod 1777 "$r/tmp"
'
    hook+="echo '$marker' >\"\$r/etc/lazaret-base\""
    args+=(--customize-hook="$hook")
    args+=("$DEBIAN_SUITE" -)
    mirror=${LAZARET_DEBIAN_MIRROR:-$(apt_mirror Debian)}
    security=${LAZARET_DEBIAN_SECURITY_MIRROR:-$(apt_mirror Debian-Security)}
    if [ -n "$mirror" ]; then
        args+=("deb $mirror $DEBIAN_SUITE main")
        case $DEBIAN_SUITE in
            sid | unstable | experimental) ;;
            *)
                args+=("deb $mirror $DEBIAN_SUITE-updates main")
                if [ -n "$security" ]; then
                    args+=("deb $security $DEBIAN_SUITE-security main")
                fi
                ;;
        esac
        echo "Debian mirror: $mirror (security: ${security:-none})"
    else
        echo "Debian mirror: mmdebstrap's default (no Debian source in this machine's apt)"
    fi
    echo "mmdebstrap $(mmdebstrap --version | awk '{print $2}'), mode $mode: $DEBIAN_VARIANT $DEBIAN_SUITE + $DEBIAN_PACKAGES"
    mmdebstrap "${args[@]}" >"$out"
    # The sandbox's /dev is gVisor's own: --skip=output/dev above leaves
    # /dev out of the tarball (mmdebstrap's tar never packs what the chroot
    # had there), and an empty /dev goes back in.
    mkdir -m 0755 "$work/devroot" "$work/devroot/dev"
    tar -rf "$out" -C "$work/devroot" --numeric-owner --owner=0 --group=0 ./dev
}

if [ -n "$base_tar" ] && [ -s "$base_tar" ]; then
    echo "base root filesystem: $base_tar (LAZARET_BASE_ROOTFS)"
    found=$(tar -xOf "$base_tar" ./etc/lazaret-base 2>/dev/null || true)
    if [ "$found" != "$marker" ]; then
        echo "error: $base_tar was not built by this script with $marker" >&2
        echo "  (it has: ${found:-no ./etc/lazaret-base}); remove it to rebuild it" >&2
        exit 1
    fi
else
    build_base "$work/base.tar"
    if [ -n "$base_tar" ]; then
        mkdir -p "$(dirname "$base_tar")"
        cp "$work/base.tar" "$base_tar.partial"
        mv "$base_tar.partial" "$base_tar"
        echo "saved the base root filesystem as $base_tar"
    else
        base_tar=$work/base.tar
    fi
fi
if [ "$(tar -tvf "$base_tar" | awk '/^[bcp]/ { n++ } END { print n + 0 }')" -gt 0 ]; then
    echo "error: $base_tar has device nodes or FIFOs" >&2
    exit 1
fi

mkdir "$work/dpkg"
tar -xOf "$base_tar" ./var/lib/dpkg/status >"$work/dpkg/status"
# shellcheck disable=SC2016,SC2086 # dpkg's ${Field} syntax; a list of names
packages=$(dpkg-query --admindir="$work/dpkg" -W -f='${Package}=${Version} ' $REPORTED_PACKAGES)
packages=${packages% }
echo "Debian $DEBIAN_SUITE ($DEBIAN_VARIANT): $packages"

if [ -n "$package" ]; then
    stage=$work/agent
    mkdir -p "$stage/usr/local"
    # With --prefix npm would look for its global configuration beneath the
    # prefix: keep this machine's (registry, proxy, cafile).
    globalconfig=$(npm config get globalconfig)
    npm_args=(--global --prefix "$stage/usr/local" --globalconfig "$globalconfig"
        --no-fund --no-audit --no-update-notifier)
    if [ "$(npm config get https-proxy)" = null ] && [ "$(npm config get proxy)" = null ] &&
        [ -z "${https_proxy:-}${HTTPS_PROXY:-}${http_proxy:-}${HTTP_PROXY:-}" ]; then
        value=$(apt_option Acquire::https::Proxy)
        value=${value:-$(apt_option Acquire::http::Proxy)}
        if [ -n "$value" ]; then
            echo "npm proxy from apt: $value"
            npm_args+=(--https-proxy "$value" --proxy "$value")
        fi
    fi
    # npm 11 asks for install scripts to be allowed by name (claude and
    # opencode put their native binary in place from one); older npm has no
    # such setting and answers "undefined".
    if [ "$(npm config get allow-scripts)" != undefined ]; then
        npm_args+=(--allow-scripts "$package")
    fi
    echo "npm install $package@$version (node $(node --version), npm $(npm --version), $(uname -m))"
    npm install "${npm_args[@]}" "$package@$version"
    if [ -z "$(ls -A "$stage/usr/local/bin" 2>/dev/null)" ]; then
        echo "error: npm installed no command for $package@$version" >&2
        exit 1
    fi
    installed=$(cd "$stage/usr/local/lib/node_modules/$package" && node -p 'require("./package.json").version')
    if [ "$installed" != "$version" ]; then
        echo "error: npm installed $package@$installed, not $version" >&2
        exit 1
    fi
    # `lazaret attach PROFILE` with no command opens a login shell: in an
    # agent image that shell starts the agent once (on a terminal, not in
    # a shell the agent itself opens), and the shell stays when it exits.
    # `lazaret attach PROFILE -- bash` opens a plain shell instead.
    mkdir -p "$stage/etc/profile.d"
    cat >"$stage/etc/profile.d/zz-lazaret-agent.sh" <<PROFILE
# Written by Lazaret's build-agent-image.sh: start $agent in a login shell.
if [ -z "\${LAZARET_AGENT_STARTED:-}" ] && [ -t 0 ] && [ -t 1 ]; then
    case \$- in
    *i*)
        export LAZARET_AGENT_STARTED=1
        cd /workspace 2>/dev/null || true
        $agent
        ;;
    esac
fi
PROFILE
    chmod 0644 "$stage/etc/profile.d/zz-lazaret-agent.sh"
    tar -cf "$work/agent.tar" -C "$stage" --numeric-owner --owner=0 --group=0 \
        --sort=name --format=pax ./etc ./usr
    echo "agent: $package@$version ($(du -sh "$stage/usr/local" | cut -f1) in /usr/local)"
fi

umoci new --image "$dest:$tag"
umoci raw add-layer --image "$dest:$tag" \
    --history.created_by "mmdebstrap --variant=$DEBIAN_VARIANT $DEBIAN_SUITE (lazaret build-agent-image.sh)" \
    --history.comment "$packages" \
    "$base_tar"
labels=(--config.label "org.lazaret.debian-suite=$DEBIAN_SUITE")
if [ -n "$package" ]; then
    umoci raw add-layer --image "$dest:$tag" \
        --history.created_by "npm install --global $package@$version (lazaret build-agent-image.sh $agent)" \
        "$work/agent.tar"
    labels+=(--config.label "org.lazaret.agent=$package@$version")
fi
umoci config --image "$dest:$tag" \
    --config.cmd /bin/bash \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --config.env HOME=/root \
    --config.env LANG=C.UTF-8 \
    --config.workingdir /workspace \
    "${labels[@]}" \
    --history.created_by "lazaret build-agent-image.sh $agent"
umoci gc --layout "$dest"
echo "inputs: Debian $DEBIAN_SUITE; $packages${package:+; $package@$version}"
echo "built oci:$(cd "$dest" && pwd):$tag"
