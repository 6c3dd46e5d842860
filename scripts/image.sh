#!/usr/bin/env bash
# docker/Dockerfile built and run without Docker (tests/ops/test_image.py, docs/deployment.md,
# "The image, tested"): Debian's buildah (chroot isolation, vfs storage, no daemon), on a
# stand-in for the Dockerfile's FROM (python:3.11-slim-bookworm) made from Debian's packages.
#
#   source scripts/image.sh; image_tools_ensure  # buildah and debootstrap, when missing
#   scripts/image.sh base              # the stand-in base, tagged as the FROM
#   scripts/image.sh build             # docker/Dockerfile on it; prints the image's name
#   scripts/image.sh buildah ARGS...   # buildah on the same storage (from, run, inspect, rm)
#
# Both are cached in PIN_IMAGE_CACHE (default ~/.cache/pin-profile-image: buildah's storage):
# the base while the functions that make it are unchanged (their hash is its label), the image
# while its context is (the base, the Dockerfile, every file it copies: the hash is its tag);
# PIN_IMAGE_REBUILD=1 builds it anyway; delete the directory to start cold. Needs root
# (debootstrap, buildah's chroot isolation).
source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

image_tools_ensure() {
    if command -v buildah >/dev/null && command -v debootstrap >/dev/null; then
        return 0
    fi
    echo "image.sh: installing Debian's buildah and debootstrap" >&2
    apt_install buildah debootstrap
}

# Sourced: only the function above.
if [ "${BASH_SOURCE[0]}" != "$0" ]; then
    return 0
fi

set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${PIN_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pin-profile-image}"
BUILDAH=(buildah --root "$CACHE/storage" --runroot "$CACHE/run" --storage-driver vfs)
REPOSITORY=localhost/pin-profile-reminders
BASE_KEY_LABEL=pin-profile.stand-in-base
BASE_CA_LABEL=pin-profile.ca-bundle-sha256
# The host's Debian bundle: this machine's network may re-sign TLS, and its pip trusts it.
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

# The Dockerfile's base image, fully qualified as buildah stores it.
from_image() {
    local from
    from=$(awk 'toupper($1) == "FROM" { print $2; exit }' docker/Dockerfile)
    case "$from" in
    */*/*) echo "$from" ;;
    */*) echo "docker.io/$from" ;;
    *) echo "docker.io/library/$from" ;;
    esac
}

label() {  # label IMAGE NAME: its value, empty when the image or the label is missing
    "${BUILDAH[@]}" inspect --type image --format "{{index .OCIv1.Config.Labels \"$2\"}}" "$1" \
        2>/dev/null || true
}

# This machine's Debian repositories as apt has them: "URI SUITE" lines.
debian_repositories() {
    apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Identifier: Packages' \
        | grep -E ' bookworm(-updates|-security)?$' | sort -u
}

# debian:bookworm-slim's dpkg filter (debuerreotype's --slimify): no docs, man pages, locales.
slim_dpkg_filter() {
    printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
        'path-exclude /usr/share/groff/*' 'path-exclude /usr/share/info/*' \
        'path-exclude /usr/share/linda/*' 'path-exclude /usr/share/lintian/*' \
        'path-exclude /usr/share/locale/*' 'path-exclude /usr/share/man/*'
}

make_base() {
    local from=$1 key=$2 mirror ctr root
    mirror=$(debian_repositories | awk '$2 == "bookworm" { print $1; exit }')
    if [ -z "$mirror" ]; then
        echo "image.sh: no Debian bookworm repository in this machine's apt sources" >&2
        exit 1
    fi
    echo "image.sh: making the stand-in for $from (debootstrap from $mirror, Debian's python3.11)" >&2
    ctr=$("${BUILDAH[@]}" from --pull=never scratch)
    BASE_CONTAINER=$ctr
    trap '"${BUILDAH[@]}" rm "$BASE_CONTAINER" >/dev/null 2>&1 || true' EXIT  # a failed attempt
    root=$("${BUILDAH[@]}" mount "$ctr")
    debootstrap --variant=minbase bookworm "$root" "$mirror" >"$CACHE/debootstrap.log" 2>&1 \
        || { tail -n 20 "$CACHE/debootstrap.log" >&2; exit 1; }
    slim_dpkg_filter >"$root/etc/dpkg/dpkg.cfg.d/docker-slim"
    find "$root/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete
    rm -rf "$root"/usr/share/{groff,info,linda,lintian,locale,man}/*
    debian_repositories | awk '{ print "deb " $1 " " $2 " main" }' >"$root/etc/apt/sources.list"
    # No fsync per file while the image is made (debuerreotype does the same): half the time.
    echo force-unsafe-io >"$root/etc/dpkg/dpkg.cfg.d/unsafe-io"
    # What python:3.11-slim-bookworm adds to debian:bookworm-slim, from Debian's packages: the
    # security updates, the CA bundle, netbase, tzdata, and Python 3.11 as a venv in /usr/local.
    "${BUILDAH[@]}" run --isolation chroot --network host "$ctr" -- sh -ec '
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get upgrade -qq -y
        apt-get install -qq -y --no-install-recommends ca-certificates netbase tzdata \
            python3.11 python3.11-venv
        apt-get clean
        rm -rf /var/lib/apt/lists/* /etc/dpkg/dpkg.cfg.d/unsafe-io
        python3.11 -m venv /usr/local' 2>&1 >"$CACHE/base.log" \
        | { grep -v "^debconf: delaying package configuration" || true; }
    "${BUILDAH[@]}" config --env LANG=C.UTF-8 \
        --env PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin --cmd python3 \
        --label "$BASE_KEY_LABEL=$key" \
        --label "$BASE_CA_LABEL=$(sha256sum <"$root$CA_BUNDLE" | cut -c1-64)" "$ctr"
    "${BUILDAH[@]}" umount "$ctr" >/dev/null
    "${BUILDAH[@]}" commit --quiet --rm "$ctr" "$from" >/dev/null
    trap - EXIT
}

# The stand-in base, made unless the one tagged as the FROM came from these same functions.
ensure_base() {
    local from key
    from=$(from_image)
    key=$(declare -f debian_repositories slim_dpkg_filter make_base | sha256sum | cut -c1-16)
    if [ "$(label "$from" "$BASE_KEY_LABEL")" = "$key" ]; then
        echo "image.sh: $from: the stand-in base is cached ($key)" >&2
        return 0
    fi
    make_base "$from" "$key"
    "${BUILDAH[@]}" rmi --prune >/dev/null 2>&1 || true  # the base it replaced, if any
    echo "image.sh: $from: the stand-in base made ($key)" >&2
}

# The build arguments the image's labels come from (docker/Dockerfile): pyproject.toml's version,
# the commit and its time, the repository's URL; one per line.
build_args() {
    local version
    version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n 1)
    echo "VERSION=${version:-unknown}"
    echo "REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "CREATED=$(git show -s --format=%cI HEAD 2>/dev/null || echo unknown)"
    echo "SOURCE=$(git config --get remote.origin.url 2>/dev/null || echo unknown)"
}

# What the build reads: the base, the Dockerfile, .dockerignore, every file it copies and the
# build arguments.
context_key() {
    local sources
    sources=$(awk 'toupper($1) == "COPY" { for (i = 2; i < NF; i++) if ($i !~ /^--/) print $i }' \
        docker/Dockerfile)
    {
        "${BUILDAH[@]}" inspect --type image --format '{{.FromImageID}}' "$(from_image)"
        declare -f build_image
        build_args
        # shellcheck disable=SC2086  # one path a word
        find docker/Dockerfile .dockerignore $sources -type f \
            ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum
    } | sha256sum | cut -c1-16
}

# Print the image's name: REPOSITORY:ctx-KEY, built unless it exists (PIN_IMAGE_REBUILD=1: built).
build_image() {
    local tag arg
    local -a args=()
    ensure_base
    while IFS= read -r arg; do args+=(--build-arg "$arg"); done < <(build_args)
    tag="$REPOSITORY:ctx-$(context_key)"
    if [ "${PIN_IMAGE_REBUILD:-0}" != 1 ] && "${BUILDAH[@]}" inspect --type image "$tag" >/dev/null 2>&1; then
        echo "image.sh: $tag: built before from this same context" >&2
    else
        # --pull=never: the base is the stand-in, never the registry's. The CA bundle is
        # mounted for the RUN steps only (tests/ops/test_image.py: it is not in the image).
        "${BUILDAH[@]}" bud --isolation chroot --network host --pull=never --quiet \
            --volume "$CA_BUNDLE:$CA_BUNDLE:ro" "${args[@]}" -f docker/Dockerfile -t "$tag" . >/dev/null
        echo "image.sh: $tag built" >&2
    fi
    # Only the newest: the images of older contexts go (vfs keeps each one whole).
    "${BUILDAH[@]}" images --format '{{.Name}}:{{.Tag}}' | grep "^$REPOSITORY:" | grep -vxF "$tag" \
        | xargs -r "${BUILDAH[@]}" rmi >/dev/null 2>&1 || true
    "${BUILDAH[@]}" rmi --prune >/dev/null 2>&1 || true
    echo "$tag"
}

mkdir -p "$CACHE"
case "${1:-}" in
base) ensure_base ;;
build) build_image ;;
buildah) shift; exec "${BUILDAH[@]}" "$@" ;;
*)
    echo "usage: image.sh base | build | buildah ARGS..." >&2
    exit 2
    ;;
esac
