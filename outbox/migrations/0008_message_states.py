"""One definition of a row's delivery state (docs/outbox-relay.md, "The stream and the slow lane"): the view
`outbox_message_states`, read by the backlog query (the gauges, the commands, the admin's
overview) and by the ORM (the admin's filters).

A row is in one lane and one state: in the stream (not detoured) it is waiting while it lies
ahead of the position and published once the position passed it; in the slow lane (detoured)
it is waiting or parked until it is published. Each branch of the view is one lane and state
with constant columns, so a query on `lane` and `state` plans only the branches it names, each
through its own index (ix_outbox_messages_stream, ix_outbox_messages_slow_key).
"""

from django.db import migrations

FORWARD_SQL = """
create view profile.outbox_message_states as
select m.id, 'stream'::text as lane, 'waiting'::text as state, m.txid, m.seq, m.created_at
from profile.outbox_messages m
where (m.txid, m.seq) > ((select p.txid from profile.outbox_relay_position p),
                         (select p.seq from profile.outbox_relay_position p))
  and m.detoured_at is null
union all
select m.id, 'stream', 'published', m.txid, m.seq, m.created_at
from profile.outbox_messages m
where (m.txid, m.seq) <= ((select p.txid from profile.outbox_relay_position p),
                          (select p.seq from profile.outbox_relay_position p))
  and m.detoured_at is null
union all
select m.id, 'slow', case when m.parked_at is null then 'waiting' else 'parked' end,
       m.txid, m.seq, m.created_at
from profile.outbox_messages m
where m.detoured_at is not null
  and m.published_at is null
union all
select m.id, 'slow', 'published', m.txid, m.seq, m.created_at
from profile.outbox_messages m
where m.detoured_at is not null
  and m.published_at is not null;
"""

REVERSE_SQL = "drop view profile.outbox_message_states;"


class Migration(migrations.Migration):

    dependencies = [
        ("outbox", "0007_drop_claimed_by"),
    ]

    operations = [migrations.RunSQL(FORWARD_SQL, REVERSE_SQL)]
