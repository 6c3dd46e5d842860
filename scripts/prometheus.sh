# Sourced by the scripts: Debian's prometheus package, for promtool (the alert-rule unit tests)
# and the server (the real-scrape test). Installed only when missing.
source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

prometheus_ensure() {
    if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
        echo "prometheus.sh: installing Debian's prometheus package" >&2
        apt_install prometheus
    fi
}
