# Sourced by scripts/test.sh: Debian's chromium and chromedriver for the admin browser test.
# Idempotent and fast when present: apt-get update runs only when a package is missing.
source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

browser_ensure() {
    if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
        return 0
    fi
    echo "browser.sh: installing Debian's chromium and chromium-driver" >&2
    apt_install chromium chromium-driver
}
