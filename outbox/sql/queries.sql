-- Every SQL statement of the outbox relay, by name. Loaded by outbox.store.
-- Blocks start with `-- name: description`. Parameters are psycopg's %(name)s.
-- Times come from the database's now(). A row is in the stream until it is detoured: published
-- once the position (outbox_relay_position) is at or past its (txid, seq), at the time of the
-- batch that passed it (outbox_relay_batches). A detoured row is in the slow lane: deliverable
-- when unpublished, not parked, and its available_at (a retry delay) is null or past; published
-- when its published_at is set.

-- read_position: where the stream has been delivered up to (one row, migration
-- 0005_stream_position)
select txid::text, seq from outbox_relay_position;

-- read_stream: up to batch_size rows after a position, in stream order (txid, seq), only of
-- transactions older than every one still running (so that no row can later commit behind the
-- position), as store.ReadMessage takes them; held = its key has a waiting or parked row in the
-- slow lane, which it must not overtake
select m.txid::text, m.seq, m.id::text, m.topic, m.message_key, m.payload::text,
       -- the Kafka headers as stored, CloudEvents' included (outbox_headers); a row stored by
       -- the previous release is completed here (outbox_sent_headers, migration
       -- 0014_cloudevents_headers)
       outbox_sent_headers(m.headers, m.id, m.event_type, m.contract_version, m.aggregate_type,
                           m.aggregate_id, m.created_at)::text,
       -- the Kafka timestamp (ms since the epoch), and the database's clock (which stamped
       -- created_at) once for the statement: each row's age when read
       floor(extract(epoch from m.created_at) * 1000)::int8,
       (select extract(epoch from clock_timestamp())::float8),
       exists (select 1 from outbox_messages s
               where s.message_key = m.message_key
                 and s.detoured_at is not null
                 and s.published_at is null) as held,
       m.attempts
from outbox_messages m
where (m.txid, m.seq) > (%(after_txid)s::xid8, %(after_seq)s::bigint)
  -- this cluster's oldest running transaction, in the stream's ids (migration 0006_stream_cluster)
  and m.txid < (select outbox_xid8_add(pg_snapshot_xmin(pg_current_snapshot()), p.txid_offset)
                from outbox_relay_position p)
  and m.detoured_at is null
order by m.txid, m.seq
limit %(batch_size)s;

-- stream_reader_session: the reader's session (outbox/lanes.py) reads the stream in index order,
-- never by sorting every row ahead: the planner cannot know how many rows lie after the position
-- (right after a bulk insert its estimate is a third of them), and would compute and sort them all
-- for each batch
set enable_sort = off;

-- stream_waiting: are there stream rows after the position that a read could not take yet (their
-- transactions are younger than one still running)?
select exists (
    select 1 from outbox_messages m
    where (m.txid, m.seq) > (%(after_txid)s::xid8, %(after_seq)s::bigint)
      and m.detoured_at is null
);

-- advance_position: move the position from where this relay read it to the end of a delivered
-- batch, on the session that took the lead, never past this cluster's transaction ids; no row
-- when one of those does not hold (query advance_refused says which)
update outbox_relay_position
set txid = %(upto_txid)s::xid8, seq = %(upto_seq)s::bigint, moved_at = now()
where (txid, seq) = (%(from_txid)s::xid8, %(from_seq)s::bigint)
  and pg_backend_pid() = %(leader_pid)s
  and %(upto_txid)s::xid8 < outbox_xid8_add(pg_snapshot_xmax(pg_current_snapshot()), txid_offset)
returning moved_at;

-- advance_refused: why advance_position moved nothing: the position was elsewhere (another relay
-- moved it), the session is not the one that took the lead (a pooler by transaction), or the
-- batch's end lies ahead of this cluster's transaction ids
select (txid, seq) = (%(from_txid)s::xid8, %(from_seq)s::bigint) as in_place,
       pg_backend_pid() = %(leader_pid)s as same_session,
       %(upto_txid)s::xid8 < outbox_xid8_add(pg_snapshot_xmax(pg_current_snapshot()), txid_offset)
           as behind_horizon
from outbox_relay_position;

-- settle_stream: the offset this cluster stamps rows with, re-basing the stream first when the
-- database moved to a cluster whose transaction ids are behind the stored ones (migration
-- 0006_stream_cluster); raises OB001 when the same cluster's stored ids are ahead of its own
select txid_offset, rebased, moved, recorded_system, this_system from outbox_stream_settle();

-- stream_cluster: the stream's cluster, read only (the audit): the cluster its ids were stamped
-- on and this one, the newest stored id and this cluster's next one (in the stream's ids), and
-- when the database last moved
select p.system_identifier,
       (select c.system_identifier from pg_control_system() c),
       greatest(p.txid, (select max(m.txid) from outbox_messages m))::text,
       outbox_xid8_add(pg_snapshot_xmax(pg_current_snapshot()), p.txid_offset)::text,
       p.txid_offset, p.previous_system_identifier, p.cluster_changed_at
from outbox_relay_position p;

-- record_batch: the batch's end and time, so that a stream row's publication time and retention are
-- known
insert into outbox_relay_batches (upto_txid, upto_seq, published_at, messages)
values (%(upto_txid)s::xid8, %(upto_seq)s::bigint, %(published_at)s, %(messages)s);

-- detour: rows of a batch that leave the stream for the slow lane: a failed delivery counts an
-- attempt and waits its retry delay (parked once it has used its attempts), a row its partition
-- could not take now (attempted false, an error) waits its retry delay without an attempt, a held
-- row (attempted false, no error) waits behind its key's head, a row the relay does not send
-- (park: its topic is not on OUTBOX_TOPICS) is parked at once with its error, no attempt counted
update outbox_messages m
set detoured_at = now(),
    attempts = m.attempts + d.attempted::int,
    last_error = coalesce(d.error, m.last_error),
    available_at = case when d.park then null
                        when d.attempted and m.attempts + 1 < %(max_attempts)s
                          then now() + d.retry_in
                        when not d.attempted and d.error is not null
                          then now() + d.retry_in end,
    parked_at = case when d.park or (d.attempted and m.attempts + 1 >= %(max_attempts)s)
                     then now() end
from unnest(%(ids)s::uuid[], %(attempted)s::bool[], %(errors)s::text[],
            %(retry_in)s::interval[], %(park)s::bool[]) as d(id, attempted, error, retry_in, park)
where m.id = d.id
  and m.detoured_at is null
returning m.id, m.parked_at is not null as parked;

-- read_slow: up to batch_size due rows of the slow lane, each the oldest waiting row of its key (a
-- delayed or parked head holds its key), as store.ReadMessage takes them (no place in the
-- stream, never held)
select null::text, null::int8, o.id::text, o.topic, o.message_key, o.payload::text,
       outbox_sent_headers(o.headers, o.id, o.event_type, o.contract_version, o.aggregate_type,
                           o.aggregate_id, o.created_at)::text,
       floor(extract(epoch from o.created_at) * 1000)::int8,
       (select extract(epoch from clock_timestamp())::float8),
       false,
       o.attempts
from outbox_messages o
where o.detoured_at is not null
  and o.published_at is null
  and o.parked_at is null
  and (o.available_at is null or o.available_at <= now())
  and not exists (
      select 1 from outbox_messages older
      where older.message_key = o.message_key
        and older.detoured_at is not null
        and older.published_at is null
        and (older.txid, older.seq) < (o.txid, o.seq))
order by o.txid, o.seq
limit %(batch_size)s;

-- try_to_lead: take the relays' session advisory lock without waiting, never on a server in
-- recovery (the lock works there too, and the relay must not lead there): true for the one relay
-- that publishes, false for a standby; the server process that looked, and the server it reached
-- (as server_identity)
select case when pg_is_in_recovery() then false
            else pg_try_advisory_lock(%(lock)s::bigint) end,
       pg_backend_pid(), c.system_identifier, pg_postmaster_start_time(), pg_is_in_recovery()
from pg_control_system() c;

-- server_identity: the server a session reached: its cluster, when its postmaster started (a
-- promoted standby has its primary's cluster id and its own start), whether it is in recovery
select c.system_identifier, pg_postmaster_start_time(), pg_is_in_recovery()
from pg_control_system() c;

-- relay_lock_holder: the session holding the relays' lock on this database (a bigint advisory
-- key is classid = its high half, objid = its low half, objsubid = 1), with what this role may
-- see of it in pg_stat_activity (another role's address and state only with pg_read_all_stats)
select l.pid, a.usename::text, host(a.client_addr), a.client_port, a.application_name, a.state,
       extract(epoch from now() - a.state_change)::float8
from pg_locks l
left join pg_stat_activity a on a.pid = l.pid
where l.locktype = 'advisory'
  and l.granted
  and l.database = (select d.oid from pg_database d where d.datname = current_database())
  and l.classid::int8 = (%(lock)s::int8 >> 32)
  and l.objid::int8 = (%(lock)s::int8 & 4294967295)
  and l.objsubid = 1
limit 1;

-- resign: release the relays' session advisory lock, so that a standby leads at once
select pg_advisory_unlock(%(lock)s::bigint);

-- mark_published: record slow-lane rows whose delivery report succeeded
update outbox_messages
set published_at = now(),
    attempts = attempts + 1,
    available_at = null
where id = any(%(ids)s::uuid[])
  and published_at is null;

-- record_failures: count a failed delivery per row, delay its retry, and park it once it has used
-- its attempts
update outbox_messages m
set attempts = m.attempts + 1,
    last_error = f.error,
    available_at = case when m.attempts + 1 >= %(max_attempts)s then null
                        else now() + f.retry_in end,
    parked_at = case when m.attempts + 1 >= %(max_attempts)s then now() end
from unnest(%(ids)s::uuid[], %(errors)s::text[], %(retry_in)s::interval[]) as f(id, error, retry_in)
where m.id = f.id
  and m.published_at is null
returning m.id, m.parked_at is not null as parked;

-- park: slow-lane rows the relay does not send as they are (their topic is not on OUTBOX_TOPICS):
-- parked at once with the reason, no attempt counted (re-queued, they are looked at again)
update outbox_messages m
set last_error = p.error,
    available_at = null,
    parked_at = now()
from unnest(%(ids)s::uuid[], %(errors)s::text[]) as p(id, error)
where m.id = p.id
  and m.published_at is null
  and m.parked_at is null
returning m.id;

-- prune_published: delete one bounded chunk of rows published before the retention cutoff: stream
-- rows behind the newest batch older than it, and slow-lane rows by their published_at (unpublished
-- rows never expire)
with cutoff as (
    select b.upto_txid, b.upto_seq from outbox_relay_batches b
    where b.published_at < now() - %(retention)s::interval
    order by b.upto_txid desc, b.upto_seq desc
    limit 1
),
stream as (
    delete from outbox_messages
    where (txid, seq) in (
        select m.txid, m.seq from outbox_messages m
        where (m.txid, m.seq) <= ((select upto_txid from cutoff), (select upto_seq from cutoff))
          and m.detoured_at is null
        order by m.txid, m.seq
        limit %(chunk)s)
    returning 1
),
slow as (
    delete from outbox_messages
    where id in (
        select id from outbox_messages
        where published_at < now() - %(retention)s::interval
        order by published_at
        limit %(chunk)s)
    returning 1
)
select (select count(*) from stream) + (select count(*) from slow);

-- prune_batches: forget the batches older than the retention that no stream row is behind any more
-- (after prune_published's chunks)
delete from outbox_relay_batches b
where b.published_at < now() - %(retention)s::interval
  and not exists (
      select 1 from outbox_messages m
      where (m.txid, m.seq) <= (b.upto_txid, b.upto_seq)
        and m.detoured_at is null);

-- record_topic_partitions: a topic's partition count as the relay sees it now (outbox/topic_watch.py,
-- migration 0011_topic_partitions): the count recorded before if it differed (null if it was the
-- same, or none was recorded), and when a relay last found it changed (seconds since the epoch,
-- null if never)
with recorded as (
    insert into outbox_topics as t (topic, partitions) values (%(topic)s, %(partitions)s)
    on conflict (topic) do update
        set partitions = excluded.partitions, previous_partitions = t.partitions,
            changed_at = now()
        where t.partitions <> excluded.partitions
    returning previous_partitions, changed_at)
select (select previous_partitions from recorded),
       extract(epoch from coalesce((select changed_at from recorded),
                                   (select changed_at from outbox_topics
                                    where topic = %(topic)s)))::float8;

-- list_parked: parked rows, oldest first, with the rows of their key held behind them in the slow
-- lane (rows of the key the stream has not reached yet join them when it does)
select p.id, p.message_key, p.event_type, p.attempts, p.parked_at, p.last_error,
       (select count(*) from outbox_messages b
        where b.message_key = p.message_key
          and b.detoured_at is not null
          and b.published_at is null
          and (b.txid, b.seq) > (p.txid, p.seq)) as blocked_behind
from outbox_messages p
where p.parked_at is not null
  and p.published_at is null
order by p.parked_at, p.id
limit %(limit)s;

-- requeue_preview: the parked rows requeue_parked would make deliverable again (all of them, or the
-- given ids), oldest parked first: id, key, created_at, parked_at
select id, message_key, created_at, parked_at
from outbox_messages
where parked_at is not null
  and published_at is null
  and (%(all)s or id = any(%(ids)s::uuid[]))
order by parked_at, id;

-- requeue_parked: make parked rows deliverable again with fresh attempts (all of them, or the given
-- ids)
update outbox_messages
set parked_at = null,
    attempts = 0,
    available_at = null
where parked_at is not null
  and published_at is null
  and (%(all)s or id = any(%(ids)s::uuid[]))
returning id;

-- outbox_backlog: the backlog, one meaning for the gauges, the admin overview and the
-- commands, from the rows' states (view outbox_message_states, migration 0008_message_states):
-- unpublished = waiting for the relay (the stream ahead of the position, and the slow lane's
-- rows not parked); parked rows are not waiting, they are counted apart; the oldest is the
-- head of the stream or the oldest waiting slow-lane row, whichever is older (null when none).
-- It reads the view's lane, state, txid, seq and created_at only (all the worker's role may
-- read, so that its metrics server can serve it). The view's stream-waiting rows (after the
-- position, not detoured) are read here after the position the caller read just before
-- (query read_position): given it, the planner sees how few rows lie after it; through the
-- view it guesses a third of the table and counts by scanning all of it (measured: 130 to
-- 160 ms on 200,000 to 400,000 rows kept after a pass that left none waiting, 0.04 ms so).
select (select count(*) from outbox_messages m
        where (m.txid, m.seq) > (%(after_txid)s::xid8, %(after_seq)s::bigint)
          and m.detoured_at is null)
       + (select count(*) from outbox_message_states s
          where s.lane = 'slow' and s.state = 'waiting') as unpublished,
       (select count(*) from outbox_message_states s
        where s.lane = 'slow' and s.state = 'parked') as parked,
       o.created_at as oldest_created_at,
       extract(epoch from now() - o.created_at) as oldest_age_s
from (select least(
          -- the stream's head, in index order: an ordered lookup cannot go through the
          -- view's union (it would sort every waiting row)
          (select m.created_at from outbox_messages m
           where (m.txid, m.seq) > (%(after_txid)s::xid8, %(after_seq)s::bigint)
             and m.detoured_at is null
           order by m.txid, m.seq
           limit 1),
          (select min(s.created_at) from outbox_message_states s
           where s.lane = 'slow' and s.state = 'waiting')) as created_at) o;

-- relax_commit_durability: this session's commits do not wait for the WAL flush (a crash may undo
-- the last marks: those rows are sent again, which at-least-once allows)
set synchronous_commit = off;

-- listen_for_new_rows: this session hears the insert trigger's notifications (channel
-- `outbox_messages`, migration 0003_relay_claims)
listen outbox_messages;

-- postpone: slow-lane rows their partition could not take now: the error and a retry delay, no
-- attempt counted (a partition's outage never parks a row)
update outbox_messages m
set last_error = f.error,
    available_at = now() + f.retry_in
from unnest(%(ids)s::uuid[], %(errors)s::text[], %(retry_in)s::interval[]) as f(id, error, retry_in)
where m.id = f.id
  and m.published_at is null
  and m.parked_at is null;

-- make_due: the waiting slow-lane rows of keys whose partition is back, due now, attempts
-- unchanged (docs/outbox-relay.md, "One partition's outage")
update outbox_messages m
set available_at = now()
where m.message_key = any(%(keys)s::text[])
  and m.detoured_at is not null
  and m.published_at is null
  and m.parked_at is null
  and m.available_at > now();
