# Sourced by the scripts: a virtual environment in .venv with the locked dev requirements
# (requirements/dev.txt: every package pinned with its hashes, and pip refuses anything else).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
stamp="$VENV/.requirements.sha"
want=$(cat "$ROOT"/requirements/*.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    if ! "$VENV/bin/pip" install -q --disable-pip-version-check --require-hashes \
            -r "$ROOT/requirements/dev.txt" \
            >"$VENV/pip.log" 2>&1; then
        cat "$VENV/pip.log" >&2
        echo "venv.sh: pip install failed" >&2
        exit 1
    fi
    "$VENV/bin/pip" check >&2
    echo "$want" > "$stamp"
fi
PY="$VENV/bin/python"
