"""The run history counts the markers a cycle re-armed: replaced in place because the
document's expiry date changed (docs/design.md §3.2, renewal re-arms). A column with a constant default is
added without rewriting the table."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('reminders', '0004_ledger_reminded_at_index'),
    ]

    operations = [
        migrations.AddField(
            model_name='reminderrun',
            name='markers_rearmed',
            field=models.IntegerField(db_default=0, default=0),
        ),
    ]
