"""The partition count of each topic the relay publishes to, as it last saw it
(docs/outbox-relay.md, "A topic that keeps what it acknowledged"): a key's partition is its
hash modulo that count, so a change moves keys to other partitions, and order per key does not
hold across it. Recorded here rather than in the relay's memory, so that a change made while
no relay ran, or seen first by another leader, is still found (and said) by the next one.

`changed_at` is when a relay found the count changed (from `previous_partitions`), null until
then. The table is created by SQL (the model, OutboxTopic, is its state only): a new, small
table (one row a topic) with its primary key and no other index (the pattern-ops index Django
adds to a text key is not wanted), under a lock timeout like every migration here.
"""

import django.db.models.functions.datetime
from django.db import migrations, models

from core.migration_ops import LockTimeoutMigration

FORWARD_SQL = """
set local lock_timeout = '5s';
create table outbox_topics (
    topic varchar(249) primary key,
    partitions integer not null constraint ck_outbox_topics_partitions check (partitions > 0),
    recorded_at timestamptz not null default now(),
    previous_partitions integer,
    changed_at timestamptz
);
"""

REVERSE_SQL = """
set local lock_timeout = '5s';
drop table outbox_topics;
"""


class Migration(LockTimeoutMigration):

    dependencies = [
        ("outbox", "0010_outbox_headers_aggregate"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD_SQL, REVERSE_SQL)],
            state_operations=[
                migrations.CreateModel(
                    name="OutboxTopic",
                    fields=[
                        ("topic", models.CharField(max_length=249, primary_key=True,
                                                   serialize=False)),
                        ("partitions", models.IntegerField()),
                        ("recorded_at", models.DateTimeField(
                            db_default=django.db.models.functions.datetime.Now())),
                        ("previous_partitions", models.IntegerField(null=True)),
                        ("changed_at", models.DateTimeField(null=True)),
                    ],
                    options={
                        "db_table": "outbox_topics",
                        "constraints": [models.CheckConstraint(
                            condition=models.Q(("partitions__gt", 0)),
                            name="ck_outbox_topics_partitions")],
                    },
                ),
            ],
        ),
    ]
