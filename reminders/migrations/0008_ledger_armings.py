"""Each marker counts its armings (docs/design.md §2.6, "One arming, one message id"): 1 from
its first write, one more each time a claim re-arms it for a new expiry date. A reminder's
message id names the arming, so a document whose expiry is corrected and corrected back is
told again under a new id, while a replay of the same arming keeps its id.

Every existing marker starts at 1, and an arming 1 is named as before the counter existed: a
reminder replayed across the upgrade keeps the id it had. The column has a constant default,
so PostgreSQL adds it to the catalog only (no rewrite, no scan of the ledger's rows); its
ACCESS EXCLUSIVE lock is brief, and waits at most LockTimeoutMigration's lock_timeout behind
a running cycle's transaction (the migration then fails and `migrate` tries it again).

And the claim's refusal of a message id the outbox holds for a reminder that says something
else (`reminder_message_id_taken`, called by `claim_batch`): it raises, so the batch rolls
back and its retry fails that owner alone, logged and counted (docs/design.md §2.6).
"""

from django.db import migrations, models

from core.migration_ops import LockTimeoutMigration

MESSAGE_ID_TAKEN = """
create or replace function reminder_message_id_taken(message_id uuid) returns boolean
language plpgsql as $$
begin
    raise exception 'message id % is in the outbox with another payload', message_id
        using errcode = 'unique_violation',
              constraint = 'outbox_messages_pkey',
              hint = 'docs/operations.md, "A message id the outbox holds for another reminder"';
end
$$
"""


class Migration(LockTimeoutMigration):

    dependencies = [
        ('reminders', '0007_run_owners_already_queued'),
    ]

    operations = [
        migrations.AddField(
            model_name='documentexpiryreminder',
            name='armings',
            field=models.IntegerField(db_default=1, default=1, help_text="Which arming of (document, threshold) this is: 1 from its first write, one more each time a new expiry date re-armed it; its reminder's message id names it"),
        ),
        migrations.RunSQL(MESSAGE_ID_TAKEN,
                          "drop function if exists reminder_message_id_taken(uuid)"),
    ]
