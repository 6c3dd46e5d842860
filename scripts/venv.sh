# Sourced by the scripts: a virtual environment in .venv with the locked dev requirements
# (requirements/dev.txt: every package pinned with its hashes, and nothing else is installed).
# The installer is uv (requirements/uv.txt, hash-pinned, in a tools venv of its own kept in
# PIN_TOOLS_CACHE): a fresh .venv takes it a few seconds where pip takes most of a minute. The
# lock is complete, so uv installs it as it is (--no-deps) and `pip check` confirms it. uv
# compiles the bytecode as pip does (--compile-bytecode): with PYTHONDONTWRITEBYTECODE set,
# every process would otherwise compile Django again. If uv cannot be had, pip installs the
# lock (--require-hashes) as before.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"

# uv_ensure: the path of the pinned uv, installed on first use; fails if it cannot be had.
uv_ensure() {
    local sum tools
    sum=$(sha256sum "$ROOT/requirements/uv.txt" | cut -c1-12)
    tools="${PIN_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pin-profile-tools}/uv-$sum"
    if [ ! -x "$tools/bin/uv" ]; then
        rm -rf "$tools"
        python3 -m venv "$tools" >&2 &&
            "$tools/bin/pip" install -q --disable-pip-version-check --require-hashes \
                -r "$ROOT/requirements/uv.txt" >&2 || { rm -rf "$tools"; return 1; }
    fi
    echo "$tools/bin/uv"
}

venv_install() {
    local uv
    if uv=$(uv_ensure 2>"$VENV/uv.log") &&
            "$uv" pip install -q --no-deps --require-hashes --compile-bytecode --python "$VENV/bin/python" \
                -r "$ROOT/requirements/dev.txt" >>"$VENV/uv.log" 2>&1; then
        return 0
    fi
    echo "venv.sh: uv could not install the lock ($VENV/uv.log); pip installs it" >&2
    if ! "$VENV/bin/pip" install -q --disable-pip-version-check --require-hashes \
            -r "$ROOT/requirements/dev.txt" >"$VENV/pip.log" 2>&1; then
        cat "$VENV/pip.log" >&2
        echo "venv.sh: pip install failed" >&2
        exit 1
    fi
}

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
stamp="$VENV/.requirements.sha"
want=$(cat "$ROOT"/requirements/*.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    venv_install
    "$VENV/bin/pip" check >&2
    echo "$want" > "$stamp"
fi
PY="$VENV/bin/python"
