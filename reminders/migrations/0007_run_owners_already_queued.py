"""The run history counts the owners whose reminder the outbox already held under its message
id (docs/design.md, "One arming, one message id"): their markers were written again, their
event was not. A column with a constant default is added without rewriting the table."""

from django.db import migrations, models

from core.migration_ops import LockTimeoutMigration

# The column's ACCESS EXCLUSIVE lock waits at most this long behind a running cycle's
# transaction (and holds back the queries queued behind it no longer): the migration fails
# instead, and is run again.
LOCK_TIMEOUT = "set local lock_timeout = '5s'"


class Migration(LockTimeoutMigration):

    dependencies = [
        ('reminders', '0006_run_trigger_and_tick'),
    ]

    operations = [
        migrations.RunSQL(LOCK_TIMEOUT, LOCK_TIMEOUT),
        migrations.AddField(
            model_name='reminderrun',
            name='owners_already_queued',
            field=models.IntegerField(db_default=0, default=0),
        ),
    ]
