"""Create the `profile` schema first; every table of this project lives in it (via search_path).

The app's pre_migrate hook creates it even earlier (so that Django's own bookkeeping
lands there too); this migration keeps the step explicit and ordered in the graph.
"""

from django.db import migrations


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []
    run_before = [
        ("contenttypes", "0001_initial"),
        ("auth", "0001_initial"),
        ("admin", "0001_initial"),
        ("sessions", "0001_initial"),
    ]
    operations = [
        migrations.RunSQL(
            "create schema if not exists profile", reverse_sql=migrations.RunSQL.noop
        ),
    ]
