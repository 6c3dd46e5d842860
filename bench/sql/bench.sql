-- The benchmarks' own SQL (bench.harness.bench_query), by name, loaded by core.queries.load.
-- It runs as the database owner, on a benchmark database only.

-- window_documents: documents in the scan window (what the cycle's census counts)
select count(*)
from person_documents d
where d.status = 'Active'
  and d.deleted_at is null
  and d.expires_at is not null
  and d.expires_at >= %(window_start)s
  and d.expires_at < %(window_end)s;

-- floor_documents: the floor's documents: every window document in one pass, with its markers' thresholds (marked: for its current expiry date; stale: for another), the columns claim_batch's `docs` reads for a batch by id; the floor is the worker's claim_batch with these as its `docs` (bench.cycle_phases.floor_statement)
with window_docs as (
    select d.id, d.owner_user_id, d.type, d.number_mask,
           (d.expires_at at time zone 'UTC')::date as expires_on
    from person_documents d
    where d.status = 'Active'
      and d.deleted_at is null
      and d.expires_at is not null
      and d.expires_at >= %(window_start)s
      and d.expires_at < %(window_end)s
),
marks as (
    -- the window's markers in one join, not a probe a document: the floor has no batch
    select w.id as document_id,
           array_agg(r.threshold_days) filter (where r.expires_at = w.expires_on) as marked,
           array_agg(r.threshold_days) filter (where r.expires_at <> w.expires_on) as stale
    from window_docs w
    join document_expiry_reminders r on r.document_id = w.id
    group by w.id
)
select w.id, w.owner_user_id, w.type, w.number_mask, w.expires_on,
       coalesce(m.marked, '{}'::int[]) as marked,
       coalesce(m.stale, '{}'::int[]) as stale
from window_docs w
left join marks m on m.document_id = w.id;

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

-- save_floor: keep the floor's markers (without ids and times) and events (with their message ids, named after the reminder as the worker names them, and their headers but the run's correlation id and the insert's time, ce_time), for the comparison
drop table if exists public.bench_floor_markers, public.bench_floor_events;
create table public.bench_floor_markers as
    select document_id, owner_user_id, type, threshold_days, expires_at, notified
    from document_expiry_reminders;
create table public.bench_floor_events as
    select id, aggregate_type, aggregate_id, event_type, contract_version, topic, message_key, payload,
           headers - array['correlation_id', 'ce_time'] as headers
    from outbox_messages;

-- save_stale: keep the stale-statistics cycle's markers (without ids and times) and events (with their message ids, and headers but the run's correlation id and the insert's time, ce_time), for the comparison with the floor (which runs after it)
drop table if exists public.bench_stale_markers, public.bench_stale_events;
create table public.bench_stale_markers as
    select document_id, owner_user_id, type, threshold_days, expires_at, notified
    from document_expiry_reminders;
create table public.bench_stale_events as
    select id, aggregate_type, aggregate_id, event_type, contract_version, topic, message_key, payload,
           headers - array['correlation_id', 'ce_time'] as headers
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
                message_key, payload, headers - array['correlation_id', 'ce_time']
         from outbox_messages
         except all
         select * from public.bench_floor_events)
        union all
        (select * from public.bench_floor_events
         except all
         select id, aggregate_type, aggregate_id, event_type, contract_version, topic,
                message_key, payload, headers - array['correlation_id', 'ce_time']
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
