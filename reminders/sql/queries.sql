-- Every SQL statement of the reminder cycle, by name. Loaded by reminders.store.
-- Blocks start with `-- name: description`. Parameters are psycopg's %(name)s.
-- Ranges on person_documents.expires_at compare with UTC-midnight instants (never a cast of
-- the column), so the partial index ix_person_documents_expires_at serves them.

-- window_census: how many documents are in the window, and how many of them are due
select count(*) as window_documents,
       count(*) filter (where exists (
           select 1
           from unnest(%(thresholds)s::int[]) as t(threshold_days)
           where (d.expires_at at time zone 'UTC')::date - %(as_of_date)s::date <= t.threshold_days
             and not exists (
                 select 1 from document_expiry_reminders r
                 where r.document_id = d.id and r.threshold_days = t.threshold_days)
       )) as due_documents
from person_documents d
where d.status = 'Active'
  and d.deleted_at is null
  and d.expires_at is not null
  and d.expires_at >= %(window_start)s
  and d.expires_at < %(window_end)s;

-- due_owners: owners with a due document (a crossed threshold without a marker), most urgent first
select d.owner_user_id, min(d.expires_at) as first_due_expiry, count(*) as due_documents
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
            where r.document_id = d.id and r.threshold_days = t.threshold_days))
group by d.owner_user_id
order by first_due_expiry, d.owner_user_id;

-- batch_documents: the window documents of a batch of owners, with the thresholds already marked
select d.id,
       d.owner_user_id,
       d.type,
       d.number_mask,
       (d.expires_at at time zone 'UTC')::date as expires_on,
       coalesce(
           (select array_agg(r.threshold_days) from document_expiry_reminders r
            where r.document_id = d.id),
           '{}'::int[]) as marked
from person_documents d
where d.owner_user_id = any(%(owner_ids)s::uuid[])
  and d.status = 'Active'
  and d.deleted_at is null
  and d.expires_at is not null
  and d.expires_at >= %(window_start)s
  and d.expires_at < %(window_end)s
order by d.owner_user_id, d.id;

-- claim_and_write: insert markers (insert-wins, in document/threshold order), then one outbox row per owner whose t* this statement won
with planned as (
    select *
    from unnest(%(m_document_ids)s::uuid[], %(m_owner_ids)s::uuid[], %(m_types)s::text[],
                %(m_expires_on)s::date[], %(m_thresholds)s::int[], %(m_notified)s::bool[])
         as p(document_id, owner_user_id, type, expires_on, threshold_days, notified)
),
claimed as (
    insert into document_expiry_reminders
        (id, document_id, owner_user_id, type, threshold_days, expires_at, reminded_at, notified, run_id)
    select gen_random_uuid(), p.document_id, p.owner_user_id, p.type, p.threshold_days,
           p.expires_on, now(), p.notified, %(run_id)s::uuid
    from planned p
    order by p.document_id, p.threshold_days
    on conflict (document_id, threshold_days) do nothing
    returning document_id, owner_user_id, threshold_days, notified
),
items as (
    select c.owner_user_id, c.document_id, c.threshold_days, i.type, i.number_mask,
           i.expires_on, i.days_left
    from claimed c
    join unnest(%(i_document_ids)s::uuid[], %(i_types)s::text[], %(i_number_masks)s::text[],
                %(i_expires_on)s::date[], %(i_days_left)s::int[])
         as i(document_id, type, number_mask, expires_on, days_left)
      on i.document_id = c.document_id
    where c.notified
),
events as (
    select gen_random_uuid() as id,
           owner_user_id,
           min(days_left) as most_urgent,
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
               'contract_version', %(contract_version)s::int::text)
           || coalesce(%(extra_headers)s::jsonb, '{}'::jsonb),
           now(), 0
    from events e
    order by e.most_urgent, e.owner_user_id
)
-- `written` runs to completion although nothing reads it (the worker may not read the outbox).
select (select count(*) from claimed) as markers_won,
       (select count(*) from events) as events_written,
       coalesce((select array_agg(document_id) from items), '{}'::uuid[]) as notified_document_ids;

-- prune_expired_markers: delete one bounded chunk of markers whose expiry date left the retention window
delete from document_expiry_reminders
where id in (
    select id from document_expiry_reminders
    where expires_at < %(cutoff)s::date
    limit %(chunk)s
);

-- count_expired_markers: what prune_expired_markers would delete (for --dry-run)
select count(*) from document_expiry_reminders where expires_at < %(cutoff)s::date;

-- start_run: record a cycle as running
insert into document_expiry_reminder_runs
    (run_id, as_of, started_at, status, thresholds, host)
values (%(run_id)s, %(as_of)s, now(), 'running', %(thresholds)s, %(host)s);

-- finish_run: record how a cycle ended, with its counters
update document_expiry_reminder_runs
set finished_at = now(),
    status = %(status)s,
    reminders_sent = %(reminders_sent)s,
    owners_notified = %(owners_notified)s,
    markers_written = %(markers_written)s,
    skipped_already_marked = %(skipped_already_marked)s,
    pruned = %(pruned)s,
    failed_owners = %(failed_owners)s,
    duration_ms = %(duration_ms)s,
    error = %(error)s
where run_id = %(run_id)s;

-- last_successful_run_start: when the latest cycle that completed its work started
select max(started_at) from document_expiry_reminder_runs
where status in ('succeeded', 'partial', 'timed_out');

-- prune_run_history: delete one bounded chunk of runs that started before the cutoff (a run that old is over, even if a crash left it `running`)
delete from document_expiry_reminder_runs
where run_id in (
    select run_id from document_expiry_reminder_runs
    where started_at < %(cutoff)s
    limit %(chunk)s
);

-- last_successful_run_finish: when the latest cycle that completed its work ended
select max(finished_at) from document_expiry_reminder_runs
where status in ('succeeded', 'partial', 'timed_out');

-- latest_run: the most recent cycle, whatever its status (for the health check)
select run_id, status, started_at, finished_at from document_expiry_reminder_runs
order by started_at desc
limit 1;

-- count_run_history: what prune_run_history would delete (for --dry-run)
select count(*) from document_expiry_reminder_runs where started_at < %(cutoff)s;
