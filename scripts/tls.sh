# Sourced by scripts/test.sh: Debian's socat (a TLS front for the Tansu broker in the relay's
# security tests) and openssl (their throwaway CA and certificates). Installed only when missing.
source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

tls_tools_ensure() {
    if command -v socat >/dev/null && command -v openssl >/dev/null; then
        return 0
    fi
    echo "tls.sh: installing Debian's socat and openssl" >&2
    apt_install socat openssl
}
