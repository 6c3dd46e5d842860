"""The relay reads the outbox as a stream and records one position per batch
(docs/outbox-relay.md, "One batch"), instead of one mark per row.

- `txid` (the writer transaction's id, `pg_current_xact_id()`) and `seq` (insertion order,
  an identity) order the stream: the relay reads rows after its position whose transaction
  is older than every transaction still running, so no row can later appear behind it.
  Neither column is in the Django model: the worker's insert and the ORM leave them to their
  defaults.
- `outbox_relay_position` (one row) is where the stream has been delivered up to;
  `outbox_relay_batches` keeps each batch's end and time (when a row was published, and
  what retention may delete).
- `outbox_published_at(row)` says when a row was published, whichever way it went.
- `detoured_at` marks a row that left the stream for the slow lane (a failed delivery, or a
  key held behind one): such a row is delivered one by one, and its `published_at` is set.

Rows already in the table are behind the initial position (txid 1, older than any
transaction, so that a transaction still running inserts ahead of it): published ones stay
published, and the unpublished ones (waiting or parked) are moved to the slow lane, so nothing
is lost and nothing is sent twice. Reversing it stamps `published_at` on the stream's published rows
from their batch's time, so the per-row design finds them published.
"""

from django.db import migrations, models

FORWARD_SQL = """
-- The rows already here get txid 1, older than any transaction, and the position is put
-- after them at txid 1: a transaction running now (its id older than this one's) that inserts
-- after the upgrade lands ahead of the position, not behind it.
alter table outbox_messages
    add column txid xid8 not null default '1',
    add column seq bigint not null generated always as identity;
alter table outbox_messages alter column txid set default pg_current_xact_id();
create index ix_outbox_messages_stream on outbox_messages (txid, seq);

create table outbox_relay_position (
    singleton boolean primary key default true check (singleton),
    txid xid8 not null,
    seq bigint not null,
    moved_at timestamptz not null default now()
);
insert into outbox_relay_position (txid, seq)
select '1', coalesce(max(seq), 0) from outbox_messages;

create table outbox_relay_batches (
    upto_txid xid8 not null,
    upto_seq bigint not null,
    published_at timestamptz not null default now(),
    messages integer not null,
    primary key (upto_txid, upto_seq)
);
create index ix_outbox_relay_batches_published_at on outbox_relay_batches (published_at);

update outbox_messages set detoured_at = now() where published_at is null;

-- When a row was published (null: not yet), whichever way it went: the slow lane sets
-- published_at; a stream row is published once the position is at or past it, at its batch's
-- time (rows published before this migration keep their published_at).
create function outbox_published_at(m outbox_messages) returns timestamptz
    language sql stable as $$
    select case
        when m.detoured_at is not null then m.published_at
        when (m.txid, m.seq) <= (select p.txid, p.seq from outbox_relay_position p) then
            coalesce((select b.published_at from outbox_relay_batches b
                      where (b.upto_txid, b.upto_seq) >= (m.txid, m.seq)
                      order by b.upto_txid, b.upto_seq
                      limit 1),
                     m.published_at)
    end
$$;
"""

REVERSE_SQL = """
update outbox_messages m
set published_at = coalesce(
        (select b.published_at from outbox_relay_batches b
         where (b.upto_txid, b.upto_seq) >= (m.txid, m.seq)
         order by b.upto_txid, b.upto_seq limit 1),
        now())
where m.published_at is null
  and m.detoured_at is null
  and (m.txid, m.seq) <= (select p.txid, p.seq from outbox_relay_position p);
drop function outbox_published_at(outbox_messages);
drop table outbox_relay_batches;
drop table outbox_relay_position;
drop index ix_outbox_messages_stream;
alter table outbox_messages drop column seq, drop column txid;
"""


class Migration(migrations.Migration):

    dependencies = [
        ("outbox", "0004_merge_0003_relay_claims_0003_requeue_permission"),
    ]

    operations = [
        migrations.AddField(
            model_name="outboxmessage",
            name="detoured_at",
            field=models.DateTimeField(
                help_text="Set when the message left the relay's stream for the slow lane "
                "(a failed delivery, or its key held behind one)",
                null=True,
            ),
        ),
        migrations.RunSQL(FORWARD_SQL, REVERSE_SQL),
        migrations.RemoveIndex(model_name="outboxmessage", name="ix_outbox_messages_unpublished"),
        migrations.RemoveIndex(
            model_name="outboxmessage", name="ix_outbox_messages_unpublished_key"
        ),
        migrations.AddIndex(
            model_name="outboxmessage",
            index=models.Index(fields=["created_at"], name="ix_outbox_messages_created_at"),
        ),
        migrations.AddIndex(
            model_name="outboxmessage",
            index=models.Index(
                condition=models.Q(("detoured_at__isnull", False), ("published_at__isnull", True)),
                fields=["message_key"],
                name="ix_outbox_messages_slow_key",
            ),
        ),
    ]
