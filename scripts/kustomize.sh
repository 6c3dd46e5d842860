# Sourced by the scripts: kustomize, which renders deploy/kubernetes (tests/ops/test_kubernetes.py),
# at the pinned release, built once from its Go module with the machine's Go toolchain (about a
# minute cold) and kept in PIN_TOOLS_CACHE; exports KUSTOMIZE, the binary's path.
KUSTOMIZE_MODULE=sigs.k8s.io/kustomize/kustomize/v5
# v5.7.1: the newest that builds with Go 1.26 (v5.8 asks for Go 1.27).
KUSTOMIZE_VERSION=v5.7.1

kustomize_ensure() {
    local bin="${PIN_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pin-profile-tools}/kustomize-$KUSTOMIZE_VERSION"
    local go
    if [ ! -x "$bin/kustomize" ]; then
        go=$(command -v go || echo /usr/local/go/bin/go)  # the machine's Go, on PATH or not
        if [ ! -x "$go" ]; then
            echo "kustomize.sh: Go is needed to build kustomize $KUSTOMIZE_VERSION" >&2
            return 1
        fi
        echo "kustomize.sh: building kustomize $KUSTOMIZE_VERSION from its Go module" >&2
        GOBIN="$bin" GOTOOLCHAIN=local "$go" install "$KUSTOMIZE_MODULE@$KUSTOMIZE_VERSION" >&2
    fi
    export KUSTOMIZE="$bin/kustomize"
}
