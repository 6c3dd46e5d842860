#!/usr/bin/env bash
# The locks: requirements/base.txt, dev.txt and uv.txt (the installer scripts/venv.sh runs),
# generated from their .in files by pip-tools' pip-compile (pinned in dev.in), every package
# pinned with its hashes. Run it
# after changing a .in file; it keeps every pin the .in still allows (the lock it rewrites is
# its starting point) and resolves only what changed. To bump one package:
#   scripts/lock.sh --upgrade-package NAME[==VERSION]
# Extra arguments go to every pip-compile run. README.md ("Dependencies") says when and how;
# tests/unit/test_locks.py fails when a lock no longer matches its .in.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
export CUSTOM_COMPILE_COMMAND="scripts/lock.sh"
for name in base dev uv; do
    "$VENV/bin/pip-compile" --quiet --generate-hashes --strip-extras --no-emit-index-url --no-emit-find-links \
        --resolver=backtracking --output-file "requirements/$name.txt" "$@" "requirements/$name.in"
done
