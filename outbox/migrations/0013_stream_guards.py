"""The relay's stream refuses what would put rows where the relay cannot see them
(docs/outbox-relay.md, "The stream on a new cluster"):

- `outbox_stream_settle()` does not re-base the stream onto this cluster, nor record a move, while
  a logical-replication subscription of this database that carries the outbox is enabled or its
  worker still runs (SQLSTATE OB004): the rows it applies later keep the publisher's ids, and
  would land among the re-based ones, out of order or behind the position. Only the catalogs
  are read (`pg_subscription` without its connection string, `pg_subscription_rel`,
  `pg_stat_subscription`), which every role may read; the function stays `SECURITY DEFINER`.
- A row that arrives with its place given (not stamped by this statement: an apply worker, a
  restore of data only, a repair by hand) at or behind the position of a stream settled on this
  cluster is refused (SQLSTATE OB005) by the row trigger `outbox_messages_behind_position`,
  `ENABLE ALWAYS` so that it fires in an apply worker too (`session_replication_role = replica`);
  such a row would never be read, and count as published. A row stamped as usual skips it (its
  `WHEN` compares the row's id with the one the statement stamps: no call per row).
"""

from django.db import migrations

from core.migration_ops import LockTimeoutMigration

FORWARD_SQL = """
set local lock_timeout = '5s';

create or replace function profile.outbox_stream_settle(
    out txid_offset bigint, out rebased boolean, out moved boolean,
    out recorded_system bigint, out this_system bigint)
    language plpgsql volatile security definer set search_path = pg_catalog, pg_temp as $$
declare
    pos record;
    newest xid8;
    next_id xid8;
    oldest_running xid8;
    applying name;
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
    -- Rows a subscription still applies keep the publisher's ids: a re-base (or a move
    -- recorded) now would stamp this cluster's rows among or ahead of them (docs/outbox-relay.md,
    -- "The stream on a new cluster"). Refused until the subscription is disabled or dropped.
    select s.subname into applying
    from pg_catalog.pg_subscription s
    where s.subdbid = (select d.oid from pg_catalog.pg_database d
                       where d.datname = pg_catalog.current_database())
      and exists (select 1 from pg_catalog.pg_subscription_rel r
                  where r.srsubid = s.oid
                    and r.srrelid in ('profile.outbox_messages'::regclass,
                                      'profile.outbox_relay_position'::regclass))
      and (s.subenabled
           or exists (select 1 from pg_catalog.pg_stat_subscription w
                      where w.subid = s.oid and w.pid is not null))
    order by s.subname
    limit 1;
    if found then
        raise exception 'the outbox stream is not re-based onto this cluster while subscription "%" still applies the outbox to this database: its rows would land among this cluster''s',
            applying
            using errcode = 'OB004',
                  hint = 'let the subscriber catch up, then disable and drop the subscription before writing here (docs/runbooks/outbox-backlog.md, "A subscription still applies the outbox")';
    end if;
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

create function profile.outbox_messages_behind_position() returns trigger
    language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
    pos record;
begin
    select p.txid, p.seq, p.system_identifier into pos from profile.outbox_relay_position p;
    -- A position of another cluster (a copy not settled yet) says nothing about this one's rows.
    if found
       and pos.system_identifier = (select c.system_identifier from pg_control_system() c)
       and (new.txid, new.seq) <= (pos.txid, pos.seq) then
        raise exception 'outbox row % arrives at stream place (%, %), at or behind the position (%, %): the relay would never send it',
            new.id, new.txid, new.seq, pos.txid, pos.seq
            using errcode = 'OB005',
                  hint = 'insert it without txid and seq (the database stamps them), or see docs/runbooks/outbox-backlog.md, "A subscription still applies the outbox"';
    end if;
    return new;
end
$$;
create trigger outbox_messages_behind_position
    before insert on profile.outbox_messages
    for each row when (new.txid is distinct from profile.outbox_stream_txid())
    execute function profile.outbox_messages_behind_position();
alter table profile.outbox_messages enable always trigger outbox_messages_behind_position;
"""

REVERSE_SQL = """
set local lock_timeout = '5s';

drop trigger outbox_messages_behind_position on profile.outbox_messages;
drop function profile.outbox_messages_behind_position();
create or replace function profile.outbox_stream_settle(
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
"""


class Migration(LockTimeoutMigration):

    dependencies = [
        ("outbox", "0012_outbox_headers_reserved"),
    ]

    operations = [migrations.RunSQL(FORWARD_SQL, REVERSE_SQL)]
