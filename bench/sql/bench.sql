-- The benchmark's own SQL (bench/bench_reminders.py), by name, loaded by core.queries.load.
-- It runs as the database owner, on a benchmark database only.

-- window_documents: documents in the scan window (what the cycle's census counts)
select count(*)
from person_documents d
where d.status = 'Active'
  and d.deleted_at is null
  and d.expires_at is not null
  and d.expires_at >= %(window_start)s
  and d.expires_at < %(window_end)s;

-- floor_cycle: the floor, a whole cycle in one statement: the same markers and outbox rows as the worker, with nothing around them
with docs as (
    select d.id, d.owner_user_id, d.type, d.number_mask,
           (d.expires_at at time zone 'UTC')::date as expires_on
    from person_documents d
    where d.status = 'Active'
      and d.deleted_at is null
      and d.expires_at is not null
      and d.expires_at >= %(window_start)s
      and d.expires_at < %(window_end)s
),
marks as materialized (
    -- Read once, before any insert: a per-row probe could meet the statement's own new rows.
    -- Only markers of the document's current expiry date count (refinement 5).
    select r.document_id, array_agg(r.threshold_days) as marked,
           min(r.threshold_days) as min_marked
    from document_expiry_reminders r
    join docs on docs.id = r.document_id and r.expires_at = docs.expires_on
    group by r.document_id
),
remaining as (
    select docs.id, docs.owner_user_id, docs.type, docs.expires_on, t.threshold_days,
           min(t.threshold_days) over (partition by docs.id) as t_star, m.min_marked
    from docs
    cross join unnest(%(thresholds)s::int[]) as t(threshold_days)
    left join marks m on m.document_id = docs.id
    where docs.expires_on - %(as_of_date)s::date <= t.threshold_days
      and t.threshold_days <> all(coalesce(m.marked, '{}'::int[]))
),
claimed as (
    insert into document_expiry_reminders
        (id, document_id, owner_user_id, type, threshold_days, expires_at, reminded_at, notified, run_id)
    -- ids as the worker makes them: time-ordered (see claim_batch)
    select encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid()) placing
               substring(int8send(floor(extract(epoch from clock_timestamp()) * 1000)::bigint)
                         from 3) from 1 for 6), 52, 1), 53, 1), 'hex')::uuid,
           r.id, r.owner_user_id, r.type, r.threshold_days, r.expires_on, now(),
           r.threshold_days = r.t_star and coalesce(r.min_marked > r.t_star, true),
           %(run_id)s::uuid
    from remaining r
    order by r.id, r.threshold_days
    -- a marker of another expiry date is re-armed in place, one of the same date never
    on conflict (document_id, threshold_days) do update
        set owner_user_id = excluded.owner_user_id, type = excluded.type,
            expires_at = excluded.expires_at, reminded_at = excluded.reminded_at,
            notified = excluded.notified, run_id = excluded.run_id
        where document_expiry_reminders.expires_at is distinct from excluded.expires_at
    returning document_id, owner_user_id, threshold_days, notified
),
items as (
    select c.owner_user_id, c.document_id, c.threshold_days, d.type, d.number_mask,
           (d.expires_at at time zone 'UTC')::date as expires_on,
           (d.expires_at at time zone 'UTC')::date - %(as_of_date)s::date as days_left
    from claimed c
    join person_documents d on d.id = c.document_id
    where c.notified
),
events as (
    select owner_user_id,
           -- the reminder's name, as claim_batch names it
           owner_user_id::text || string_agg(
               ';' || document_id::text || ',' || threshold_days::text || ','
               || to_char(expires_on, 'YYYY-MM-DD'),
               '' order by document_id, threshold_days, expires_on) as name,
           jsonb_build_object(
               'ownerUserId', owner_user_id::text,
               'remindedAt', %(reminded_at)s::text,
               'documents', jsonb_agg(jsonb_build_object(
                   'documentId', document_id::text,
                   'type', type,
                   'numberMask', number_mask,
                   'expiresAt', to_char(expires_on, 'YYYY-MM-DD'),
                   'thresholdDays', threshold_days,
                   'daysLeft', days_left) order by days_left, document_id)) as payload
    from items
    group by owner_user_id
),
identified as (
    -- the message id as claim_batch computes it (version 8 over SHA-256 of namespace and name)
    select e.owner_user_id, e.payload,
           encode(set_byte(set_byte(h.bytes, 6, (get_byte(h.bytes, 6) & 15) | 128),
                           8, (get_byte(h.bytes, 8) & 63) | 128), 'hex')::uuid as id
    from events e
    cross join lateral (
        select substring(sha256(uuid_send(%(message_id_namespace)s::uuid)
                                || convert_to(e.name, 'UTF8')) from 1 for 16) as bytes
    ) h
),
written as (
    insert into outbox_messages
        (id, aggregate_type, aggregate_id, event_type, contract_version, topic, message_key,
         payload, headers, created_at, attempts)
    select e.id, %(aggregate_type)s::text, e.owner_user_id::text, %(event_type)s::text,
           %(contract_version)s::int, %(topic)s::text, e.owner_user_id::text, e.payload,
           jsonb_build_object(
               'message_id', e.id::text,
               'correlation_id', %(run_id)s::text,
               'event_type', %(event_type)s::text,
               'contract_version', %(contract_version)s::int::text),
           now(), 0
    from identified e
    returning 1
)
select (select count(*) from claimed) as markers, (select count(*) from written) as events;

-- reset_cycle_output: empty the ledger, the outbox and the run history (between floor and worker)
truncate document_expiry_reminders, outbox_messages, document_expiry_reminder_runs;

-- seed_renewed_markers: markers of an earlier expiry date (30 days before the current one) for every threshold of about 1 window document in 20, as a renewal leaves them: the cold cycle re-arms those its thresholds reach
insert into document_expiry_reminders
    (id, document_id, owner_user_id, type, threshold_days, expires_at, reminded_at, notified, run_id)
select gen_random_uuid(), d.id, d.owner_user_id, d.type, t.threshold_days,
       (d.expires_at at time zone 'UTC')::date - 30, now(), t.threshold_days = 0,
       '00000000-0000-4000-8000-000000000000'::uuid
from person_documents d
cross join unnest(%(thresholds)s::int[]) as t(threshold_days)
where d.status = 'Active'
  and d.deleted_at is null
  and d.expires_at is not null
  -- the earlier date stays inside the retention: no prune tells the worker from the floor
  and d.expires_at >= %(window_start)s + interval '30 days'
  and d.expires_at < %(window_end)s
  and get_byte(uuid_send(d.id), 15) < 13;

-- save_floor: keep the floor's markers (without ids and times) and events (with their message ids, named after the reminder as the worker names them), for the comparison
drop table if exists public.bench_floor_markers, public.bench_floor_events;
create table public.bench_floor_markers as
    select document_id, owner_user_id, type, threshold_days, expires_at, notified
    from document_expiry_reminders;
create table public.bench_floor_events as
    select id, aggregate_type, aggregate_id, event_type, contract_version, topic, message_key, payload
    from outbox_messages;

-- save_stale: keep the stale-statistics cycle's markers (without ids and times) and events (with their message ids), for the comparison with the floor (which runs after it)
drop table if exists public.bench_stale_markers, public.bench_stale_events;
create table public.bench_stale_markers as
    select document_id, owner_user_id, type, threshold_days, expires_at, notified
    from document_expiry_reminders;
create table public.bench_stale_events as
    select id, aggregate_type, aggregate_id, event_type, contract_version, topic, message_key, payload
    from outbox_messages;

-- compare_stale_with_floor: rows that differ between the stale-statistics cycle's output and the floor's, both ways
select
    (select count(*) from (
        (select * from public.bench_stale_markers except all
         select * from public.bench_floor_markers)
        union all
        (select * from public.bench_floor_markers except all
         select * from public.bench_stale_markers)) as m) as markers_differing,
    (select count(*) from (
        (select * from public.bench_stale_events except all
         select * from public.bench_floor_events)
        union all
        (select * from public.bench_floor_events except all
         select * from public.bench_stale_events)) as e) as events_differing;

-- compare_with_floor: rows that differ between the worker's output and the floor's, both ways
select
    (select count(*) from (
        (select document_id, owner_user_id, type, threshold_days, expires_at, notified
         from document_expiry_reminders
         except all
         select * from public.bench_floor_markers)
        union all
        (select * from public.bench_floor_markers
         except all
         select document_id, owner_user_id, type, threshold_days, expires_at, notified
         from document_expiry_reminders)) as m) as markers_differing,
    (select count(*) from (
        (select id, aggregate_type, aggregate_id, event_type, contract_version, topic,
                message_key, payload
         from outbox_messages
         except all
         select * from public.bench_floor_events)
        union all
        (select * from public.bench_floor_events
         except all
         select id, aggregate_type, aggregate_id, event_type, contract_version, topic,
                message_key, payload
         from outbox_messages)) as e) as events_differing,
    (select count(*) from public.bench_floor_markers) as floor_markers,
    (select count(*) from public.bench_floor_events) as floor_events;

-- ledger_size: markers and outbox rows now
select (select count(*) from document_expiry_reminders), (select count(*) from outbox_messages);

-- sample_owners: a batch's worth of due owners, for EXPLAIN of the per-batch query
select owner_user_id from person_documents
where status = 'Active' and deleted_at is null and expires_at >= %(window_start)s
  and expires_at < %(window_end)s
limit 150

-- notified_rows: rows shaped as claim_batch's last select (the notified items' log fields, ids as text, then the totals), three a owner, by owner, for bench/log_lines_bench.py
select md5(s.salt || (n / 3)::text)::uuid::text, gen_random_uuid()::text,
       (array['Passport', 'Visa', 'DriverLicense', 'Inn'])[1 + n %% 4],
       (array[30, 7, 1, 0])[1 + n %% 4], n %% 30 - 5,
       3 * %(rows)s::int, %(rows)s::int, %(rows)s::int / 3, 0, 0
from (select random()::text as salt) s
cross join generate_series(1, %(rows)s::int) as n
order by 1, 5, 2;
