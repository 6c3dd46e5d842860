"""The lease's column goes: no relay claims rows any more (docs/outbox-relay.md, "One relay at a
time"); `available_at` is only the slow lane's retry delay."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("outbox", "0006_stream_cluster"),
    ]

    operations = [
        migrations.RemoveField(model_name="outboxmessage", name="claimed_by"),
        migrations.AlterField(
            model_name="outboxmessage",
            name="available_at",
            field=models.DateTimeField(
                help_text="A slow-lane row is not delivered before this instant: its retry delay",
                null=True,
            ),
        ),
    ]
