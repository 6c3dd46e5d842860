-- Every SQL statement of the audit (manage.py audit_reminders), by name. Loaded by audit.checks.
-- Blocks start with `-- name: description`. Parameters are psycopg's %(name)s.
-- Read-only: the audit's transaction is `repeatable read, read only`, one snapshot for every
-- check. Events are matched to markers on text (the headers and the payload are JSON), so a
-- malformed row is a finding, never a failed cast.

-- audit_snapshot: the audit's one transaction is one snapshot for every check, and writes nothing
set transaction isolation level repeatable read, read only;

-- audit_session: memory enough for the audit's transaction to hash the window's markers and event
-- items (a daily read of a few hundred thousand rows; a merge of them would sort each side)
set local work_mem = '128MB';

-- snapshot_clock: the database's clock, once, in the audit's snapshot (the window's cutoffs and the
-- waits are measured on it)
select now() as now;

-- ledger_outbox: the runs of the window (notified markers reminded in it, or events written in
-- it), what was read of them, and what disagrees between their markers and their events (each a
-- JSON array, its count whole): a notified marker no event of its run lists (at its threshold and
-- expiry), an event item with no marker of its run, and an item listed twice; and, apart, the
-- reminders a run claimed again that the outbox already held under their message id (written by
-- another run: already queued), whose markers and event are not findings
with scope_runs as materialized (
    select distinct run_id::text as run_id
    from document_expiry_reminders
    where notified
      and reminded_at >= %(since)s and reminded_at <= %(until)s
    union
    select distinct headers ->> 'correlation_id'
    from outbox_messages
    where created_at >= %(since)s and created_at <= %(until)s
      and event_type = %(event_type)s
),
events as materialized (
    select m.id, m.aggregate_id, m.headers ->> 'correlation_id' as run_id, m.payload,
           m.created_at
    from outbox_messages m
    where m.headers ->> 'correlation_id' in (select run_id from scope_runs)
      and m.event_type = %(event_type)s
),
items as materialized (
    select e.id as message_id, e.aggregate_id as owner_user_id, e.run_id,
           e.created_at as written_at,
           i.item ->> 'documentId' as document_id,
           i.item ->> 'thresholdDays' as threshold_days,
           i.item ->> 'expiresAt' as expires_at,
           concat_ws('|', e.run_id, e.aggregate_id, i.item ->> 'documentId',
                     i.item ->> 'thresholdDays', i.item ->> 'expiresAt') as key
    from events e
    cross join lateral jsonb_array_elements(
        case when jsonb_typeof(e.payload -> 'documents') = 'array'
             then e.payload -> 'documents' else '[]'::jsonb end) as i(item)
),
markers as materialized (
    select r.document_id::text as document_id, r.threshold_days::text as threshold_days,
           r.expires_at::text as expires_at, r.run_id::text as run_id, r.owner_user_id,
           concat_ws('|', r.run_id, r.owner_user_id, r.document_id, r.threshold_days,
                     r.expires_at) as key
    from document_expiry_reminders r
    where r.notified
      and r.run_id::text in (select run_id from scope_runs)
),
-- each side's rows against the other's keys, one text key a side (a hash anti-join)
unmatched_markers as materialized (
    select m.document_id, m.threshold_days, m.expires_at, m.run_id, m.owner_user_id
    from markers m
    where not exists (select 1 from items i where i.key = m.key)
),
unmatched_items as materialized (
    select i.document_id, i.threshold_days, i.expires_at, i.run_id, i.message_id, i.written_at,
           case when i.document_id ~* %(uuid_pattern)s then i.document_id::uuid end as document,
           case when i.threshold_days ~ '^-?[0-9]{1,9}$' then i.threshold_days::int end
               as threshold
    from items i
    where not exists (select 1 from markers m where m.key = i.key)
),
-- the (run, owner) whose reminder may have been claimed again: a run's markers without its
-- event, or the marker an event's item lost to another run (its run may be after the window)
reclaims as materialized (
    select distinct m.run_id::uuid as run_id, m.owner_user_id
    from unmatched_markers m
    union
    select r.run_id, r.owner_user_id
    from unmatched_items i
    join document_expiry_reminders r
      on r.document_id = i.document and r.threshold_days = i.threshold
     and r.expires_at::text = i.expires_at and r.notified and r.run_id::text <> i.run_id
),
-- each such run's reminder of the owner, named as the claim names it (reminders/sql/queries.sql
-- claim_batch, `events` and `identified`: the same expressions, tests/unit/test_audit_message_id.py)
reclaimed as (
    select run_id, owner_user_id,
           owner_user_id::text || string_agg(
               ';' || document_id::text || ',' || threshold_days::text || ','
               || to_char(expires_on, 'YYYY-MM-DD')
               || case when armings > 1 then ',' || armings::text else '' end,
               '' order by document_id, threshold_days, expires_on) as name
    from (
        select r.run_id, r.owner_user_id, r.document_id, r.threshold_days,
               r.expires_at as expires_on, r.armings
        from reclaims c
        -- one probe of the owner index a (run, owner), fenced as claim_batch's probes are
        cross join lateral (
            select r.run_id, r.owner_user_id, r.document_id, r.threshold_days, r.expires_at,
                   r.armings
            from document_expiry_reminders r
            where r.owner_user_id = c.owner_user_id and r.run_id = c.run_id and r.notified
            offset 0
        ) r
    ) notified
    group by run_id, owner_user_id
),
identified as materialized (
    select e.run_id::text as run_id, e.owner_user_id,
           encode(set_byte(set_byte(h.bytes, 6, (get_byte(h.bytes, 6) & 15) | 128),
                           8, (get_byte(h.bytes, 8) & 63) | 128), 'hex')::uuid as id
    from reclaimed e
    cross join lateral (
        select substring(sha256(uuid_send(%(message_id_namespace)s::uuid)
                                || convert_to(e.name, 'UTF8')) from 1 for 16) as bytes
    ) h
),
-- already queued: the outbox holds that reminder under its id, written by another run (the
-- ledger restored or rolled back without its outbox); the claim wrote no second event
queued_again as materialized (
    select e.run_id, e.owner_user_id, e.id as message_id, q.queued_by
    from identified e
    cross join lateral (
        select m.headers ->> 'correlation_id' as queued_by
        from outbox_messages m
        where m.id = e.id
        offset 0
    ) q
    where q.queued_by is distinct from e.run_id
),
marker_without_event as (
    select m.document_id, m.threshold_days, m.expires_at, m.run_id
    from unmatched_markers m
    where not exists (select 1 from queued_again q
                      where q.run_id = m.run_id and q.owner_user_id = m.owner_user_id)
),
-- an item without its marker, unless the marker was pruned since (its expiry left the
-- retention) or re-armed in place since: for a new expiry date (the document was renewed), or by
-- a later arming back to the item's date (corrected, then corrected back: the marker has had more
-- than one arming and was rewritten after the event); or its event was queued again by the run
-- that holds its marker now
event_without_marker as (
    select i.document_id, i.threshold_days, i.expires_at, i.run_id, i.message_id
    from unmatched_items i
    where not (i.expires_at ~ '^\d{4}-\d{2}-\d{2}$' and i.expires_at < %(pruned_before)s::text)
      and not exists (
        select 1 from document_expiry_reminders r
        where r.document_id = i.document
          and r.threshold_days = i.threshold
          and (r.expires_at::text <> i.expires_at
               or (r.armings > 1 and r.reminded_at > i.written_at)))
      and not exists (select 1 from queued_again q where q.message_id = i.message_id)
),
-- one (document, threshold, expiry) in more than one event, and one arming told twice: more
-- events list the (document, threshold) than its marker has had armings (each arming tells a
-- threshold once; a date corrected back is told again in an arming of its own, under its own id)
notified_twice as (
    select t.document_id, t.threshold_days, t.expires_at, t.runs, t.events
    from (
        select i.document_id, i.threshold_days, i.expires_at,
               string_agg(distinct i.run_id, ',' order by i.run_id) as runs,
               string_agg(i.message_id::text, ',' order by i.message_id::text) as events
        from items i
        group by i.document_id, i.threshold_days, i.expires_at
        having count(*) > 1
    ) t
    -- the events of each (document, threshold), counted once (a hash join, not a scan of the
    -- items per group)
    join (
        select document_id, threshold_days, count(*) as events
        from items
        group by document_id, threshold_days
    ) n on n.document_id = t.document_id and n.threshold_days = t.threshold_days
    where n.events > coalesce((
              select r.armings from document_expiry_reminders r
              where r.document_id = case when t.document_id ~* %(uuid_pattern)s
                                         then t.document_id::uuid end
                and r.threshold_days = case when t.threshold_days ~ '^-?[0-9]{1,9}$'
                                            then t.threshold_days::int end), 1)
)
select (select count(*) from scope_runs) as runs,
       (select count(*) from events) as events,
       (select count(*) from items) as event_items,
       (select count(*) from markers) as notified_markers,
       (select coalesce(json_agg(json_build_object(
                'document', f.document_id, 'threshold', f.threshold_days,
                'expires', f.expires_at, 'run', f.run_id)), '[]')
        from marker_without_event f) as marker_without_event,
       (select coalesce(json_agg(json_build_object(
                'document', f.document_id, 'threshold', f.threshold_days,
                'expires', f.expires_at, 'run', f.run_id, 'event', f.message_id)), '[]')
        from event_without_marker f) as event_without_marker,
       (select coalesce(json_agg(json_build_object(
                'document', f.document_id, 'threshold', f.threshold_days,
                'expires', f.expires_at, 'runs', f.runs, 'events', f.events)), '[]')
        from notified_twice f) as notified_twice,
       -- the window's runs only: its count is the sum of their owners_already_queued
       (select coalesce(json_agg(json_build_object(
                'run', q.run_id, 'queued_by', q.queued_by, 'event', q.message_id)
                order by q.run_id, q.message_id), '[]')
        from queued_again q
        where q.run_id in (select run_id from scope_runs)) as already_queued;

-- last_loop_cycle: the last loop cycle that finished with nothing left (succeeded)
select r.run_id, r.as_of, r.started_at, r.thresholds
from document_expiry_reminder_runs r
where r.status = 'succeeded'
  and r.trigger = 'loop'
order by r.started_at desc
limit 1;

-- latest_pruning_run: the as-of of the newest cycle that pruned (markers before its cutoff may be
-- gone)
select max(as_of) as as_of
from document_expiry_reminder_runs
where status = any(%(pruning_statuses)s::text[]);

-- left_behind: documents that were due at a cycle's as-of (a crossed threshold without a marker for
-- the document's current expiry date) and are still: the ones unchanged since the cycle started
-- (a JSON array, oldest expiry first), and a count of those changed since (excepted); an owner
-- whose event of the run is full (max_documents) legitimately has the rest left for the next cycle
with due as (
    select d.id, d.owner_user_id, d.expires_at, d.updated_at >= %(started_at)s as changed
    from person_documents d
    where d.status = 'Active'
      and d.deleted_at is null
      and d.expires_at is not null
      and d.expires_at >= %(window_start)s
      and d.expires_at < %(window_end)s
      and exists (
          select 1
          from unnest(%(thresholds)s::int[]) as t(threshold_days)
          where (d.expires_at at time zone 'UTC')::date - %(as_of_date)s::date <= t.threshold_days
            and not exists (
                select 1 from document_expiry_reminders r
                where r.document_id = d.id and r.threshold_days = t.threshold_days
                  and r.expires_at = (d.expires_at at time zone 'UTC')::date))
),
full_owners as (
    select m.aggregate_id
    from outbox_messages m
    where m.headers ->> 'correlation_id' = %(run_id)s::text
      and m.event_type = %(event_type)s
      and jsonb_array_length(m.payload -> 'documents') >= %(max_documents)s
)
select count(*) filter (where d.changed) as changed_since,
       coalesce(json_agg(json_build_object(
                    'document', d.id, 'owner', d.owner_user_id,
                    'expires', (d.expires_at at time zone 'UTC')::date)
                order by d.expires_at, d.id) filter (where not d.changed),
           '[]') as left_behind
from due d
where d.changed
   or d.owner_user_id::text not in (select aggregate_id from full_owners);

-- relay_waits: how many events were examined (those of the window, and every event still waiting
-- wherever it was written; parked rows are listed apart), and those that waited (until published,
-- or until now) longer than the bound (a JSON array, oldest first)
with candidates as (
    select m.id from outbox_messages m
    where m.created_at >= %(since)s and m.created_at <= %(until)s
    union
    select m.id from outbox_messages m
    where (m.txid, m.seq) > ((select p.txid from outbox_relay_position p),
                             (select p.seq from outbox_relay_position p))
      and m.detoured_at is null
    union
    select m.id from outbox_messages m
    where m.detoured_at is not null and m.published_at is null
),
waits as materialized (
    select m.id, m.message_key, m.created_at, outbox_published_at(m) as published_at
    from outbox_messages m
    where m.id in (select id from candidates)
      and m.parked_at is null
)
select (select count(*) from waits) as events,
       (select coalesce(json_agg(json_build_object(
                'event', w.id, 'key', w.message_key, 'created', w.created_at,
                'published', w.published_at,
                'waited_s', round(extract(epoch from coalesce(w.published_at, %(now)s)
                                                     - w.created_at))::bigint)
                order by w.created_at, w.id), '[]')
        from waits w
        where coalesce(w.published_at, %(now)s) - w.created_at > %(bound)s::interval
       ) as waited_too_long;

-- parked: every parked event (the relay gave up on it), oldest first, with its error and the rows
-- of its key held behind it (a JSON array); apart, with their topic, those whose topic is not on
-- the relay's allowlist (OUTBOX_TOPICS: the relay never sent them)
with parked as materialized (
    select p.id, p.message_key, p.topic, p.attempts, p.parked_at, p.last_error,
           p.topic = any(%(topics)s::text[]) as allowed,
           (select count(*) from outbox_messages b
            where b.message_key = p.message_key
              and b.detoured_at is not null
              and b.published_at is null
              and (b.txid, b.seq) > (p.txid, p.seq)) as held_behind
    from outbox_messages p
    where p.parked_at is not null
      and p.published_at is null
)
select (select coalesce(json_agg(json_build_object(
                   'event', p.id, 'key', p.message_key, 'attempts', p.attempts,
                   'parked', p.parked_at, 'error', p.last_error, 'held_behind', p.held_behind)
                   order by p.parked_at, p.id), '[]')
        from parked p where p.allowed) as parked,
       (select coalesce(json_agg(json_build_object(
                   'event', p.id, 'key', p.message_key, 'topic', p.topic,
                   'parked', p.parked_at, 'error', p.last_error, 'held_behind', p.held_behind)
                   order by p.parked_at, p.id), '[]')
        from parked p where not p.allowed) as parked_off_allowlist;

-- window_events_for_topic: the events of the window as the topic should have them: id, key, topic,
-- whether the table says published, in stream order (txid, seq) per key
select m.id::text as id, m.message_key as key, m.topic,
       outbox_published_at(m) is not null as published
from outbox_messages m
where m.created_at >= %(since)s and m.created_at <= %(until)s
order by m.txid, m.seq;

-- events_by_id: which of these ids the outbox holds, wherever they were written (a record on the
-- topic timestamped in the window may be a row just outside it)
select m.id::text as id from outbox_messages m where m.id = any(%(ids)s::uuid[]);
