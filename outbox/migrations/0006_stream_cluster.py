"""The stream's position knows its cluster (docs/outbox-relay.md, "The stream on a new cluster").

A row's place in the stream is its writer's transaction id. Those ids only grow on one
PostgreSQL cluster; a database dumped and restored, or moved by logical replication, lands on a
cluster whose counter may be far behind the ids it carries, and every row written there would
sort behind the position: never read, and reported published.

- The position records the cluster its ids come from (`system_identifier`) and an offset
  (`txid_offset`) that this cluster's ids are shifted by: a row's `txid` is its writer's
  transaction id plus the offset (function `outbox_stream_txid`, the column's default).
- `outbox_stream_settle()` checks, before any row of an inserting statement is stamped (the
  statement trigger `outbox_messages_stream_stamp`) and whenever the relay leads, that the
  stored ids lie behind this cluster's. On a new cluster whose ids are behind them it re-bases:
  the offset lifts this cluster's ids above every stored one, so the rows written here come
  after everything copied, in order. On the same cluster, stored ids ahead of its own can only
  come from an edit: it refuses (SQLSTATE OB001) rather than guess.
- The functions name their tables with the schema, so they mean the same whatever the caller's
  search_path; `outbox_published_at` is redefined that way too (still inlinable).

Reversing it is refused once the stream was re-based: the old default would stamp rows behind
the position again.
"""

from django.db import migrations

FORWARD_SQL = """
alter table profile.outbox_relay_position
    add column system_identifier bigint,
    add column txid_offset bigint not null default 0,
    add column previous_system_identifier bigint,
    add column cluster_changed_at timestamptz;
update profile.outbox_relay_position
set system_identifier = (select c.system_identifier from pg_catalog.pg_control_system() c);
alter table profile.outbox_relay_position alter column system_identifier set not null;

-- xid8 has no arithmetic: through numeric (an xid8 is an unsigned 64-bit number).
create function profile.outbox_xid8_add(x xid8, n bigint) returns xid8
    language sql immutable strict parallel safe as $$
    select (x::text::numeric + n)::text::xid8
$$;

-- A new row's place in the stream: its transaction's id, plus the offset that the statement
-- trigger read for this statement (null, and so refused by NOT NULL, without the trigger).
create function profile.outbox_stream_txid() returns xid8
    language sql volatile parallel unsafe as $$
    select profile.outbox_xid8_add(
        pg_catalog.pg_current_xact_id(),
        nullif(pg_catalog.current_setting('outbox.txid_offset', true), '')::bigint)
$$;

-- The offset to stamp rows with on this cluster, re-basing the stream first if the database
-- moved to a cluster whose transaction ids are behind the stored ones (see the module's doc).
create function profile.outbox_stream_settle(
    out txid_offset bigint, out rebased boolean, out moved boolean,
    out recorded_system bigint, out this_system bigint)
    language plpgsql volatile security definer set search_path = pg_catalog, pg_temp as $$
declare
    pos record;
    newest xid8;
    next_id xid8;
    oldest_running xid8;
begin
    this_system := (select c.system_identifier from pg_control_system() c);
    select p.* into pos from profile.outbox_relay_position p;
    if not found then
        raise exception 'the outbox stream has no position: profile.outbox_relay_position is empty'
            using errcode = 'OB002';
    end if;
    rebased := false;
    moved := false;
    recorded_system := pos.system_identifier;
    txid_offset := pos.txid_offset;
    -- One statement, one snapshot: the newest stored id, and what lies past every id that
    -- snapshot can see (one past the newest completed transaction, or past this one's own id,
    -- whose rows it sees already).
    select greatest(pos.txid, (select max(m.txid) from profile.outbox_messages m)),
           greatest(pg_snapshot_xmax(pg_current_snapshot()),
                    profile.outbox_xid8_add(pg_current_xact_id_if_assigned(), 1)),
           pg_snapshot_xmin(pg_current_snapshot())
    into newest, next_id, oldest_running;
    -- The usual case: the cluster the ids were stamped on, every stored id behind its next one.
    if pos.system_identifier = this_system
       and newest < profile.outbox_xid8_add(next_id, pos.txid_offset) then
        return;
    end if;
    select p.* into pos from profile.outbox_relay_position p for update;
    recorded_system := pos.system_identifier;
    txid_offset := pos.txid_offset;
    select greatest(pos.txid, (select max(m.txid) from profile.outbox_messages m)),
           greatest(pg_snapshot_xmax(pg_current_snapshot()),
                    profile.outbox_xid8_add(pg_current_xact_id_if_assigned(), 1)),
           pg_snapshot_xmin(pg_current_snapshot())
    into newest, next_id, oldest_running;
    if pos.system_identifier = this_system then
        -- Another statement recorded the move meanwhile, or the same cluster's ids are ahead.
        if newest >= profile.outbox_xid8_add(next_id, pos.txid_offset) then
            raise exception 'the outbox stream is ahead of this cluster''s transaction ids on the cluster it was written on (stored % >= next %): the position or a row''s txid was edited',
                newest, profile.outbox_xid8_add(next_id, pos.txid_offset)
                using errcode = 'OB001',
                      hint = 'see docs/runbooks/outbox-backlog.md, "The stream is ahead of its cluster"';
        end if;
        return;
    end if;
    moved := true;
    -- A transaction running now may stamp its rows later: its id is at least the snapshot's
    -- xmin, so the offset lifts xmin itself above the newest stored id.
    if newest >= profile.outbox_xid8_add(oldest_running, pos.txid_offset) then
        txid_offset := (newest::text::numeric + 1 - oldest_running::text::numeric)::bigint;
        rebased := true;
    end if;
    update profile.outbox_relay_position p
    set system_identifier = this_system,
        previous_system_identifier = pos.system_identifier,
        txid_offset = outbox_stream_settle.txid_offset,
        cluster_changed_at = now();
end
$$;
-- Executable by every role (the default): any writer's statement trigger runs it, and all it
-- can do is what an insert would.

-- Before the rows of any inserting statement are stamped: the offset for this statement.
-- (No SET clause here: a SET LOCAL inside such a function would not outlive it.)
create function profile.outbox_messages_stream_stamp() returns trigger
    language plpgsql as $$
begin
    perform pg_catalog.set_config(
        'outbox.txid_offset',
        (select s.txid_offset from profile.outbox_stream_settle() s)::text,
        true);
    return null;
end
$$;
create trigger outbox_messages_stream_stamp
    before insert on profile.outbox_messages
    for each statement execute function profile.outbox_messages_stream_stamp();
alter table profile.outbox_messages alter column txid set default profile.outbox_stream_txid();

create or replace function profile.outbox_published_at(m profile.outbox_messages)
    returns timestamptz language sql stable as $$
    select case
        when m.detoured_at is not null then m.published_at
        when (m.txid, m.seq) <= (select p.txid, p.seq from profile.outbox_relay_position p) then
            coalesce((select b.published_at from profile.outbox_relay_batches b
                      where (b.upto_txid, b.upto_seq) >= (m.txid, m.seq)
                      order by b.upto_txid, b.upto_seq
                      limit 1),
                     m.published_at)
    end
$$;
"""

REVERSE_SQL = """
do $$
begin
    if exists (select 1 from profile.outbox_relay_position where txid_offset <> 0) then
        raise exception 'the outbox stream was re-based onto this cluster (txid_offset <> 0): migrating back would stamp new rows behind its position'
            using errcode = 'OB003';
    end if;
end
$$;
alter table profile.outbox_messages alter column txid set default pg_current_xact_id();
drop trigger outbox_messages_stream_stamp on profile.outbox_messages;
drop function profile.outbox_messages_stream_stamp();
drop function profile.outbox_stream_settle();
drop function profile.outbox_stream_txid();
drop function profile.outbox_xid8_add(xid8, bigint);
alter table profile.outbox_relay_position
    drop column system_identifier,
    drop column txid_offset,
    drop column previous_system_identifier,
    drop column cluster_changed_at;
"""


class Migration(migrations.Migration):

    dependencies = [
        ("outbox", "0005_stream_position"),
    ]

    operations = [
        migrations.RunSQL(FORWARD_SQL, REVERSE_SQL),
    ]
