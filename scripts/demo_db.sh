# Sourced by the demo scripts: the venv and a PostgreSQL server (venv.sh, pg.sh), and
# demo_database NAME: a fresh demo database with the schema, the documents table, the roles
# and demo documents, on the dev settings (the demo needs devtools).
source scripts/venv.sh
source scripts/pg.sh
pg_ensure

demo_database() {
    local name=$1
    psql "$PG_ADMIN_URL" -qc "drop database if exists $name with (force)" >/dev/null
    psql "$PG_ADMIN_URL" -qc "create database $name" >/dev/null
    export DATABASE_URL; DATABASE_URL=$(database_url "$name")
    export DJANGO_SETTINGS_MODULE=pin_profile.settings_dev
    echo "== migrate"
    "$PY" manage.py migrate -v 0
    "$PY" manage.py create_dev_person_documents >/dev/null
    "$PY" manage.py apply_db_roles >/dev/null
    echo "== seed"
    "$PY" manage.py seed_demo_documents --owners "${DEMO_OWNERS:-300}"
}
