"""Each run records its trigger (a tick of the loop, or a manual run) and, for a loop run, the
tick it ran for, on the worker's clock: the loop decides whether a tick was missed from the
recorded ticks alone (one clock), and a manual run or a backfill never stands in for the
loop's run of a tick. Runs from before this migration count as manual, so the first loop
after the upgrade runs its current tick at once (a no-op where that day's work is done).
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('reminders', '0005_run_markers_rearmed'),
    ]

    operations = [
        migrations.AddField(
            model_name='reminderrun',
            name='tick',
            field=models.DateTimeField(null=True),
        ),
        migrations.AddField(
            model_name='reminderrun',
            name='trigger',
            field=models.CharField(choices=[('loop', 'Loop'), ('manual', 'Manual')], db_default='manual', default='manual', max_length=16),
        ),
    ]
