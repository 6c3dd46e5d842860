# Sourced by scripts/test.sh: Debian's chromium and chromedriver for the admin browser test.
# Idempotent and fast when present: apt-get update runs only when a package is missing.
browser_ensure() {
    if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
        return 0
    fi
    echo "browser.sh: installing Debian's chromium and chromium-driver" >&2
    export DEBIAN_FRONTEND=noninteractive
    local sudo=()
    if [ "$(id -u)" != 0 ]; then sudo=(sudo); fi
    if ! "${sudo[@]}" apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null 2>&1; then
        "${sudo[@]}" apt-get update -qq >/dev/null
        "${sudo[@]}" apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
    fi
}
