# Sourced by the scripts: Debian's prometheus package, for promtool (the alert-rule unit tests)
# and the server (the real-scrape test). Installed only when missing.
prometheus_ensure() {
    if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
        echo "prometheus.sh: installing Debian's prometheus package" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    fi
}
