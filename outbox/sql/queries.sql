-- Every SQL statement of the outbox relay, by name. Loaded by outbox.store.
-- Blocks start with `-- name: description`. Parameters are psycopg's %(name)s.
-- Times come from the database's now(); a row is deliverable when it is unpublished, not parked,
-- and its available_at (a retry delay) is null or past.

-- read_batch: up to batch_size deliverable rows after a (created_at, id) position, in that order, each the oldest unpublished row of its key; read by the one leading relay, so nothing is leased
select o.id, o.topic, o.message_key, o.payload::text, o.headers::text, o.aggregate_type,
       o.aggregate_id, o.created_at, o.attempts,
       -- the row's age now, on the database's clock (which stamped created_at)
       extract(epoch from clock_timestamp() - o.created_at)::float8
from outbox_messages o
where o.published_at is null
  and o.parked_at is null
  and (o.available_at is null or o.available_at <= now())
  and (o.created_at, o.id) > (%(after_created_at)s::timestamptz, %(after_id)s::uuid)
  -- Order per key: only the head of each key; a delayed, parked or in-flight head holds its key.
  and not exists (
      select 1 from outbox_messages older
      where older.message_key = o.message_key
        and older.published_at is null
        and (older.created_at, older.id) < (o.created_at, o.id))
order by o.created_at, o.id
limit %(batch_size)s;

-- try_to_lead: take the relays' session advisory lock without waiting: true for the one relay that publishes, false for a standby
select pg_try_advisory_lock(%(lock)s::bigint);

-- resign: release the relays' session advisory lock, so that a standby leads at once
select pg_advisory_unlock(%(lock)s::bigint);

-- mark_published: record rows whose delivery report succeeded
update outbox_messages
set published_at = now(),
    attempts = attempts + 1,
    available_at = null,
    claimed_by = null
where id = any(%(ids)s::uuid[])
  and published_at is null;

-- record_failures: count a failed delivery per row, delay its retry, and park it once it has used its attempts
update outbox_messages m
set attempts = m.attempts + 1,
    last_error = f.error,
    claimed_by = null,
    available_at = case when m.attempts + 1 >= %(max_attempts)s then null
                        else now() + f.retry_in end,
    parked_at = case when m.attempts + 1 >= %(max_attempts)s then now() end
from unnest(%(ids)s::uuid[], %(errors)s::text[], %(retry_in)s::interval[]) as f(id, error, retry_in)
where m.id = f.id
  and m.published_at is null
returning m.id, m.parked_at is not null as parked;

-- prune_published: delete one bounded chunk of rows published before the retention cutoff (unpublished rows never expire)
delete from outbox_messages
where id in (
    select id from outbox_messages
    where published_at < now() - %(retention)s::interval
    order by published_at
    limit %(chunk)s
);

-- list_parked: parked rows, oldest first, with what blocks behind them
select p.id, p.message_key, p.event_type, p.attempts, p.parked_at, p.last_error,
       (select count(*) from outbox_messages b
        where b.message_key = p.message_key
          and b.published_at is null
          and (b.created_at, b.id) > (p.created_at, p.id)) as blocked_behind
from outbox_messages p
where p.parked_at is not null
  and p.published_at is null
order by p.parked_at, p.id
limit %(limit)s;

-- requeue_parked: make parked rows deliverable again with fresh attempts (all of them, or the given ids)
update outbox_messages
set parked_at = null,
    attempts = 0,
    available_at = null,
    claimed_by = null
where parked_at is not null
  and published_at is null
  and (%(all)s or id = any(%(ids)s::uuid[]))
returning id;

-- outbox_backlog: the backlog, one meaning for the gauges, the admin overview and the commands: unpublished = waiting for the relay (not published, not parked); parked rows are not waiting, they are counted apart; the oldest is the oldest waiting row (null when none)
-- It reads only created_at, published_at and parked_at (all the worker's role may read, so
-- its metrics server can serve it) through the partial index ix_outbox_messages_unpublished.
select count(*) filter (where parked_at is null) as unpublished,
       count(*) filter (where parked_at is not null) as parked,
       min(created_at) filter (where parked_at is null) as oldest_created_at,
       extract(epoch from now() - min(created_at) filter (where parked_at is null)) as oldest_age_s
from outbox_messages
where published_at is null;

-- relax_commit_durability: this session's commits do not wait for the WAL flush (a crash may undo the last marks: those rows are sent again, which at-least-once allows)
set synchronous_commit = off;

-- listen_for_new_rows: this session hears the insert trigger's notifications (channel `outbox_messages`, migration 0003_relay_claims)
listen outbox_messages;
