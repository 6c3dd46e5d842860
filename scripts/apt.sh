# Sourced by the scripts that install a Debian package the tests need when it is missing.

# apt_install PACKAGE...: install them (no recommends), refreshing the package lists only when
# the first try fails (a fresh machine has none), as root or through sudo.
apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    local sudo=()
    if [ "$(id -u)" != 0 ]; then sudo=(sudo); fi
    if ! "${sudo[@]}" apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1; then
        "${sudo[@]}" apt-get update -qq >/dev/null
        "${sudo[@]}" apt-get install -y -qq --no-install-recommends "$@" >/dev/null
    fi
}
