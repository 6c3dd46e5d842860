# Sourced by scripts/test.sh: Debian's socat (a TLS front for the Tansu broker in the relay's
# security tests) and openssl (their throwaway CA and certificates). Installed only when missing.
tls_tools_ensure() {
    if command -v socat >/dev/null && command -v openssl >/dev/null; then
        return 0
    fi
    echo "tls.sh: installing Debian's socat and openssl" >&2
    export DEBIAN_FRONTEND=noninteractive
    local sudo=()
    if [ "$(id -u)" != 0 ]; then sudo=(sudo); fi
    if ! "${sudo[@]}" apt-get install -y -qq --no-install-recommends socat openssl >/dev/null 2>&1; then
        "${sudo[@]}" apt-get update -qq >/dev/null
        "${sudo[@]}" apt-get install -y -qq --no-install-recommends socat openssl >/dev/null
    fi
}
