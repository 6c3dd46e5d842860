# Sourced by scripts/test.sh and scripts/test-clock.sh: everything the tests need, installed
# or started when missing: the venv with the pinned requirements, PostgreSQL, Debian's
# prometheus (promtool), chromium and chromium-driver, faketime, socat and openssl, pgbouncer,
# kustomize (built with Go); then
# DATABASE_URL for the tests (TEST_DATABASE_URL, or pin_profile on the local server).
source scripts/venv.sh
source scripts/pg.sh
pg_ensure
source scripts/prometheus.sh
prometheus_ensure
source scripts/browser.sh
browser_ensure
source scripts/clock.sh
faketime_ensure  # also for tests/acceptance/test_database_clock.py: commands on a skewed clock
source scripts/tls.sh
tls_tools_ensure
source scripts/pooler.sh
pgbouncer_ensure
source scripts/image.sh && image_tools_ensure  # buildah, debootstrap: tests/ops/test_image.py
source scripts/kustomize.sh
kustomize_ensure  # tests/ops/test_kubernetes.py renders deploy/kubernetes

# Tests create and drop their own database (test_<name>) on this server.
export DATABASE_URL="${TEST_DATABASE_URL:-$(database_url pin_profile)}"
