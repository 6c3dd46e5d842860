-- Every SQL statement of the reminder cycle, by name. Loaded by reminders.store.
-- Blocks start with `-- name: description`. Parameters are psycopg's %(name)s.
-- Ranges on person_documents.expires_at compare with UTC-midnight instants (never a cast of
-- the column), so the partial index ix_person_documents_expires_at serves them.
-- A marker counts only when its expires_at is the document's current UTC expiry date (a
-- renewed or corrected document is re-armed): every query that reads markers says so.

-- tune_session: JIT would compile the due-owners scan for about as long as it runs; nothing the
-- worker runs gains from it
set jit = off;

-- window_census: how many documents are in the window, and how many of them are due (backlog gauge,
-- admin overview)
select count(*) as window_documents,
       count(*) filter (where exists (
           select 1
           from unnest(%(thresholds)s::int[]) as t(threshold_days)
           where (d.expires_at at time zone 'UTC')::date - %(as_of_date)s::date <= t.threshold_days
             -- the (document, threshold) marker by its unique key, compared with the current
             -- date in the select list, where no index can serve the date: with the ledger's
             -- statistics stale the planner ANDed the expiry-date index into each probe, a
             -- read of every marker of that date for every window document
             and not coalesce((
                 select r.expires_at = (d.expires_at at time zone 'UTC')::date
                 from document_expiry_reminders r
                 where r.document_id = d.id and r.threshold_days = t.threshold_days), false)
       )) as due_documents
from person_documents d
where d.status = 'Active'
  and d.deleted_at is null
  and d.expires_at is not null
  and d.expires_at >= %(window_start)s
  and d.expires_at < %(window_end)s;

-- due_owners_plan: for the due-owners pass's transaction (the held cursor is planned when
-- declared): the markers by a join, one pass over the window and one over the ledger, whatever the
-- statistics say: with the window estimated at 1 row after a bulk load, the planner probed the
-- ledger once a window document, each probe ANDing the expiry-date index (every marker of that
-- date)
set local enable_nestloop = off;

-- due_owners: in one pass over the window, every owner with a window document, due owners first
-- (most urgent first), each row carrying the window's census and the ids of the owner's due
-- documents
with window_documents as materialized (
    -- due: more crossed thresholds (days_left <= t) than markers among them. The markers come
    -- by a join (parallel, one pass over the ledger), not a probe per document and threshold;
    -- width_bucket(x, ascending) counts the thresholds <= x, so n - width_bucket(left - 1)
    -- counts those >= left.
    select d.owner_user_id,
           d.id,
           d.expires_at,
           cardinality(%(thresholds)s::int[])
           - width_bucket((d.expires_at at time zone 'UTC')::date - %(as_of_date)s::date - 1,
                          array(select t from unnest(%(thresholds)s::int[]) as t order by t))
           > count(r.document_id) as due
    from person_documents d
    left join document_expiry_reminders r
      on r.document_id = d.id
     and r.threshold_days = any(%(thresholds)s::int[])
     and r.threshold_days >= (d.expires_at at time zone 'UTC')::date - %(as_of_date)s::date
     and r.expires_at = (d.expires_at at time zone 'UTC')::date
    where d.status = 'Active'
      and d.deleted_at is null
      and d.expires_at is not null
      and d.expires_at >= %(window_start)s
      and d.expires_at < %(window_end)s
    group by d.id
),
owners as (
    select owner_user_id,
           min(expires_at) filter (where due) as first_due_expiry,
           count(*) filter (where due) as due_documents,
           count(*) as window_documents,
           -- the claim reads these by primary key: an owner's other documents (out of the
           -- window, archived, deleted: three in four at steady 10M) are never fetched. Most
           -- urgent first (UTC expiry date, id): the cycle keeps an owner's first
           -- max_documents_per_event (plan.most_urgent_per_owner's order). As text: the
           -- worker only slices and passes them back (no UUID object a document).
           array_agg(id::text order by (expires_at at time zone 'UTC')::date, id)
               filter (where due) as due_document_ids
    from window_documents
    group by owner_user_id
)
-- (the census as bigint: a numeric on every row cost the worker a decimal parse an owner)
select owner_user_id, first_due_expiry, due_documents,
       (sum(window_documents) over ())::bigint as window_documents,
       (sum(due_documents) over ())::bigint as window_due_documents,
       due_document_ids
from owners
order by due_documents = 0, first_due_expiry, owner_user_id;

-- tune_transaction: tune_session for one transaction (behind a transaction pooler, where a
-- session setting would reach whichever client the server connection serves next)
set local jit = off;

-- due_owners_page: due_owners for a connection that cannot hold a cursor across transactions
-- (a transaction pooler): the due owners after a key (first due expiry, owner), most urgent first,
-- a page at a time, each page the same one pass; owners with a marker of this cycle (`run_id`) are
-- left out, so that an owner an earlier page claimed (whose first due expiry moved on when part of
-- its documents were capped out) is never read twice. The census on every row is this pass's
-- (the cycle keeps the first page's, taken before any claim): a row of nulls but the census when
-- no owner is left. The ids as one text an owner (a page's memory: a string an owner, split when
-- its batch comes)
with window_documents as materialized (
    -- due: more crossed thresholds (days_left <= t) than markers among them. The markers come
    -- by a join (parallel, one pass over the ledger), not a probe per document and threshold;
    -- width_bucket(x, ascending) counts the thresholds <= x, so n - width_bucket(left - 1)
    -- counts those >= left.
    select d.owner_user_id,
           d.id,
           d.expires_at,
           cardinality(%(thresholds)s::int[])
           - width_bucket((d.expires_at at time zone 'UTC')::date - %(as_of_date)s::date - 1,
                          array(select t from unnest(%(thresholds)s::int[]) as t order by t))
           > count(r.document_id) as due,
           -- a marker this cycle wrote: the owner was claimed by an earlier page's batch
           coalesce(bool_or(r.run_id = %(run_id)s::uuid), false) as claimed
    from person_documents d
    left join document_expiry_reminders r
      on r.document_id = d.id
     and r.threshold_days = any(%(thresholds)s::int[])
     and r.threshold_days >= (d.expires_at at time zone 'UTC')::date - %(as_of_date)s::date
     and r.expires_at = (d.expires_at at time zone 'UTC')::date
    where d.status = 'Active'
      and d.deleted_at is null
      and d.expires_at is not null
      and d.expires_at >= %(window_start)s
      and d.expires_at < %(window_end)s
    group by d.id
),
owners as (
    select owner_user_id,
           min(expires_at) filter (where due) as first_due_expiry,
           count(*) filter (where due) as due_documents,
           count(*) as window_documents,
           bool_or(claimed) as claimed,
           -- the claim reads these by primary key: an owner's other documents (out of the
           -- window, archived, deleted: three in four at steady 10M) are never fetched. Most
           -- urgent first (UTC expiry date, id): the cycle keeps an owner's first
           -- max_documents_per_event (plan.most_urgent_per_owner's order). As text: the
           -- worker only slices and passes them back (no UUID object a document).
           array_agg(id::text order by (expires_at at time zone 'UTC')::date, id)
               filter (where due) as due_document_ids
    from window_documents
    group by owner_user_id
)
select o.owner_user_id, o.first_due_expiry, o.due_documents,
       c.window_documents, c.window_due_documents,
       array_to_string(o.due_document_ids, ',') as due_document_ids
from (select coalesce(sum(window_documents), 0) as window_documents,
             coalesce(sum(due_documents), 0) as window_due_documents
      from owners) c
left join (
    select owner_user_id, first_due_expiry, due_documents, due_document_ids
    from owners
    where due_documents > 0
      and not claimed
      and (%(after_expiry)s::timestamptz is null
           or (first_due_expiry, owner_user_id)
              > (%(after_expiry)s::timestamptz, %(after_owner)s::uuid))
    order by first_due_expiry, owner_user_id
    limit %(page_owners)s
) o on true
order by o.first_due_expiry, o.owner_user_id;

-- batch_documents: the window documents of a batch of owners, with their markers' thresholds and
-- the expiry dates they were written for (for --dry-run)
select d.id,
       d.owner_user_id,
       d.type,
       d.number_mask,
       (d.expires_at at time zone 'UTC')::date as expires_on,
       coalesce(m.thresholds, '{}'::int[]) as marked_thresholds,
       coalesce(m.expiry_dates, '{}'::date[]) as marked_for
from unnest(%(owner_ids)s::uuid[]) as o(owner_user_id)
-- owner by owner through the owner index (not `owner_user_id = any(...)`: see claim_batch),
-- fenced as claim_batch's probe: `offset 0` keeps it a probe per owner, and the window is
-- checked outside it, so that the expiry index cannot serve it (a read of the whole window
-- per owner when the window is estimated small)
join lateral (
    select d.id, d.owner_user_id, d.type, d.number_mask, d.expires_at, d.status, d.deleted_at
    from person_documents d
    where d.owner_user_id = o.owner_user_id
    offset 0
) d on d.status = 'Active'
   and d.deleted_at is null
   and d.expires_at is not null
   and d.expires_at >= %(window_start)s
   and d.expires_at < %(window_end)s
left join lateral (
    select array_agg(r.threshold_days order by r.threshold_days) as thresholds,
           array_agg(r.expires_at order by r.threshold_days) as expiry_dates
    from document_expiry_reminders r
    where r.document_id = d.id
) m on true
order by d.owner_user_id, d.id;

-- claim_batch: for a batch of owners, in one statement: their due documents (by id, from
-- due_owners) and markers, the rules (as reminders.rules.decide), the markers (insert-wins, in
-- document/threshold order), one outbox row per owner whose t* this statement won (its id named
-- after the reminder and its markers' arming: an owner whose reminder the outbox holds already
-- gets none, and one whose id the outbox holds for a reminder that says something else fails the
-- statement), and the notified items for the log
with docs as materialized (
    -- marked: the thresholds marked for the current expiry date; stale: those marked for
    -- another date (renewed or corrected), which count for nothing and are re-armed in place.
    -- One index probe a document. (A join to the ledger gets planned as a scan of the whole
    -- ledger once it is large, for every batch.) All probes run before the insert below,
    -- whose sort reads every planned row first.
    -- The documents are the batch owners' due documents as due_owners listed them (at most
    -- max_documents_per_event an owner, the most urgent: the cycle caps them), read by
    -- primary key, one probe each, and checked against the window again (the row may have
    -- changed since). Not `owner_user_id = any(...)`: the planner ANDed the owner index with
    -- a range scan of the expiry index over the whole window (280,000 entries at steady 10M)
    -- for every batch, and the owner index fetches every document of the owner.
    select d.id, d.owner_user_id, d.type, d.number_mask, e.expires_on,
           coalesce(m.marked, '{}'::int[]) as marked,
           coalesce(m.stale, '{}'::int[]) as stale
    from unnest(%(document_ids)s::uuid[]) as o(id)
    -- A fence, whatever the statistics say: `offset 0` keeps the planner from pulling the
    -- probe up into a plain join (which, with the window estimated at 1 row after a bulk
    -- load, it reordered into a read of the whole window joined to every id of the batch),
    -- and the window is checked outside it (no qual crosses an offset), so that id is the
    -- only condition an index can serve: one primary-key probe an id.
    join lateral (
        select d.id, d.owner_user_id, d.type, d.number_mask, d.expires_at, d.status,
               d.deleted_at
        from person_documents d
        where d.id = o.id
        offset 0
    ) d on d.status = 'Active'
       and d.deleted_at is null
       and d.expires_at is not null
       and d.expires_at >= %(window_start)s
       and d.expires_at < %(window_end)s
    cross join lateral (select (d.expires_at at time zone 'UTC')::date as expires_on) e
    left join lateral (
        select array_agg(r.threshold_days) filter (where r.expires_at = e.expires_on) as marked,
               array_agg(r.threshold_days) filter (where r.expires_at <> e.expires_on) as stale
        from document_expiry_reminders r
        where r.document_id = d.id
    ) m on true
),
remaining as (
    -- crossed thresholds (days_left <= t) that have no marker for the current expiry date
    select docs.id, docs.owner_user_id, docs.type, docs.expires_on, t.threshold_days,
           docs.marked, t.threshold_days = any(docs.stale) as rearm
    from docs
    cross join unnest(%(thresholds)s::int[]) as t(threshold_days)
    where docs.expires_on - %(as_of_date)s::date <= t.threshold_days
      and t.threshold_days <> all(docs.marked)
),
planned as (
    -- mark every remaining threshold; notify t* = min(remaining) unless a smaller one is marked
    -- (stale)
    select r.id, r.owner_user_id, r.type, r.expires_on, r.threshold_days, r.rearm,
           r.threshold_days = min(r.threshold_days) over (partition by r.id)
           and not (r.threshold_days > any(r.marked)) as notified
    from remaining r
),
claimed as (
    insert into document_expiry_reminders
        (id, document_id, owner_user_id, type, threshold_days, expires_at, reminded_at, notified, run_id)
    -- time-ordered ids (UUIDv7 layout): the primary key grows at its right edge instead of
    -- dirtying a random leaf page (and its full-page WAL image) for every marker
    select encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid()) placing
               substring(int8send(floor(extract(epoch from clock_timestamp()) * 1000)::bigint)
                         from 3) from 1 for 6), 52, 1), 53, 1), 'hex')::uuid,
           p.id, p.owner_user_id, p.type, p.threshold_days,
           p.expires_on, now(), p.notified, %(run_id)s::uuid
    from planned p
    order by p.id, p.threshold_days
    -- A marker of another expiry date is replaced in place, so exactly one instance wins it
    -- (the others wait on its row lock, then see the new date and return nothing); a marker
    -- of the same date is never rewritten. A new marker is its arming 1 (the column's
    -- default); each re-arm is the next arming, which its reminder's message id names.
    on conflict (document_id, threshold_days) do update
        set owner_user_id = excluded.owner_user_id,
            type = excluded.type,
            expires_at = excluded.expires_at,
            reminded_at = excluded.reminded_at,
            notified = excluded.notified,
            run_id = excluded.run_id,
            armings = document_expiry_reminders.armings + 1
        where document_expiry_reminders.expires_at is distinct from excluded.expires_at
    returning document_id, owner_user_id, type, threshold_days, expires_at, notified, armings
),
items as (
    -- the number mask goes into the event only, never back to the worker
    -- a blank type goes out as 'Unknown' (events.UNKNOWN_DOCUMENT_TYPE): the contract needs one
    select c.owner_user_id, c.document_id, c.threshold_days,
           case when c.type ~ '\S' then c.type else %(unknown_type)s::text end as type,
           d.number_mask,
           c.expires_at as expires_on, c.expires_at - %(as_of_date)s::date as days_left,
           c.armings
    from claimed c
    join docs d on d.id = c.document_id
    where c.notified
),
events as (
    select owner_user_id,
           min(days_left) as most_urgent,
           -- the reminder's name (events.message_id_name): the owner, then its items by
           -- document, threshold, expiry date (a uuid sorts as its lowercase text), each with
           -- its marker's arming from the second on (a first arming is named as before the
           -- arming counted)
           owner_user_id::text || string_agg(
               ';' || document_id::text || ',' || threshold_days::text || ','
               || to_char(expires_on, 'YYYY-MM-DD')
               || case when armings > 1 then ',' || armings::text else '' end,
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
    -- one reminder, one id, whenever it is written (events.message_id): RFC 9562 version 8
    -- over SHA-256 of the namespace and the name, with built-in functions only; the audit's
    -- ledger_outbox repeats this and the name word for word (tests/unit/test_audit_message_id.py)
    select e.owner_user_id, e.most_urgent, e.payload,
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
           -- the outbox's headers, built by the outbox (outbox migration
           -- 0010_outbox_headers_aggregate)
           outbox_headers(e.id, %(run_id)s::text, %(event_type)s::text,
                          %(contract_version)s::int, %(aggregate_type)s::text,
                          e.owner_user_id::text, %(extra_headers)s::jsonb),
           now(), 0
    from identified e
    order by e.most_urgent, e.owner_user_id
    -- the same reminder is already in the outbox (a ledger restored or rolled back without its
    -- outbox): its markers are written again, its event is not (the owner is already queued)
    on conflict (id) do nothing
    returning id
),
written_owners as (
    select e.owner_user_id from identified e where e.id in (select id from written)
),
taken as (
    -- an id the outbox held before this statement (the statement's snapshot) for a reminder
    -- that says something else: its body but `remindedAt` and each document's `daysLeft` (which
    -- a later cycle's replay of the same arming recomputes: the contract's redelivery) differs.
    -- The outbox's row, by primary key, for the ids not written only.
    select e.id
    from identified e
    cross join lateral (
        select m.payload from outbox_messages m where m.id = e.id offset 0
    ) m
    where e.id not in (select id from written)
      and (m.payload - 'remindedAt' - 'documents' is distinct from
               e.payload - 'remindedAt' - 'documents'
           or exists (select d - 'daysLeft' from jsonb_array_elements(m.payload -> 'documents') d
                      except all
                      select d - 'daysLeft' from jsonb_array_elements(e.payload -> 'documents') d)
           or exists (select d - 'daysLeft' from jsonb_array_elements(e.payload -> 'documents') d
                      except all
                      select d - 'daysLeft' from jsonb_array_elements(m.payload -> 'documents') d))
),
refused as (
    -- never silently dropped: the function raises (a unique violation on the outbox's key), the
    -- batch rolls back and is retried owner by owner, and this owner fails, logged and counted,
    -- its markers unwritten, due again next cycle (docs/design.md §2.6)
    select reminder_message_id_taken(t.id) from taken t
),
totals as (
    select (select count(*) from claimed) as markers_won,
           (select count(distinct id) from planned) as due_documents,
           (select count(*) from written) as events_written,
           -- (`refused` is empty whenever the statement returns)
           (select count(*) from identified) - (select count(*) from written)
           - (select count(*) from refused) as already_queued,
           -- won markers that replaced one of another date (as read by this statement)
           (select count(*) from claimed c
            join planned p on p.id = c.document_id and p.threshold_days = c.threshold_days
            where p.rearm) as markers_rearmed
)
-- one row per notified item of a written event (owner, document, type, threshold, days left: the
-- log line's fields, ids as text, ready to write), or one row of nulls; then the totals on every row
select i.owner_user_id::text, i.document_id::text, i.type, i.threshold_days, i.days_left,
       t.markers_won, t.due_documents, t.events_written, t.markers_rearmed, t.already_queued
from totals t
left join items i on i.owner_user_id in (select owner_user_id from written_owners)
order by i.owner_user_id, i.days_left, i.document_id;

-- prune_plan: for the rest of the prune chunk's transaction, whatever the statistics say: the
-- chunk's markers through the ledger's expiry index, oldest first, stopping at the chunk (a
-- sequential scan from the table's start reads again every marker earlier chunks deleted and vacuum
-- has not removed yet; a bitmap scan reads every expired entry before the limit), then by primary
-- key
select set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true);

-- prune_expired_markers: delete one bounded chunk of markers whose expiry date left the retention
-- window
-- The ids as an array (computed once): the rows by primary key, never `id in (...)` as a join,
-- which stale statistics planned as a scan of every expired marker for each chunk.
delete from document_expiry_reminders
where id = any(array(
    select id from document_expiry_reminders
    where expires_at < %(cutoff)s::date
    limit %(chunk)s
))
  -- checked again on the row itself: a stale marker that a claim re-armed meanwhile stays
  and expires_at < %(cutoff)s::date;

-- count_expired_markers: what prune_expired_markers would delete (for --dry-run)
select count(*) from document_expiry_reminders where expires_at < %(cutoff)s::date;

-- prune_census: before prune_reminders deletes: what it would delete (markers expiring before the
-- cutoff), how many of those are of documents not expired yet on the database's clock (expiring on
-- or after its UTC date today), the ledger's size, and that date
select count(*) filter (where expires_at < %(cutoff)s::date),
       count(*) filter (where expires_at < %(cutoff)s::date
                          and expires_at >= (now() at time zone 'UTC')::date),
       count(*),
       (now() at time zone 'UTC')::date
from document_expiry_reminders;

-- close_abandoned_runs: runs left `running` long past any cycle's budget (their process was killed)
-- are recorded as failed; aged on the database's clock, which stamped started_at
update document_expiry_reminder_runs
set status = 'failed',
    error = 'abandoned: the process ended without recording the end of its cycle'
where status = 'running'
  and started_at < now() - %(older_than)s::interval;

-- start_run: record a cycle as running, with its trigger (loop or manual) and the loop's tick it
-- runs for
insert into document_expiry_reminder_runs
    (run_id, as_of, started_at, status, thresholds, host, trigger, tick)
values (%(run_id)s, %(as_of)s, now(), 'running', %(thresholds)s, %(host)s, %(trigger)s, %(tick)s);

-- finish_run: record how a cycle ended, with its counters
update document_expiry_reminder_runs
set finished_at = now(),
    status = %(status)s,
    reminders_sent = %(reminders_sent)s,
    owners_notified = %(owners_notified)s,
    markers_written = %(markers_written)s,
    markers_rearmed = %(markers_rearmed)s,
    owners_already_queued = %(owners_already_queued)s,
    skipped_already_marked = %(skipped_already_marked)s,
    pruned = %(pruned)s,
    failed_owners = %(failed_owners)s,
    duration_ms = %(duration_ms)s,
    error = %(error)s
where run_id = %(run_id)s;

-- last_loop_tick: the latest tick a loop run completed its work for (the tick is on the worker's
-- clock; manual runs and backfills do not count)
select max(tick) from document_expiry_reminder_runs
where trigger = 'loop'
  and status = any(%(successful)s::text[]);

-- prune_run_history: delete one bounded chunk of runs that started longer ago than older_than on
-- the database's clock, which stamped started_at (a run that old is over, even if a crash left it
-- `running`)
delete from document_expiry_reminder_runs
where run_id in (
    select run_id from document_expiry_reminder_runs
    where started_at < now() - %(older_than)s::interval
    limit %(chunk)s
);

-- run_history_ages: the latest successful end and the latest run, with their ages on the database's
-- clock (now() stamped them), for the liveness checks and the last-success gauge
select s.finished_at as last_success, now() - s.finished_at as since_success,
       l.status as latest_status, l.started_at as latest_started_at,
       now() - l.started_at as latest_age
from (select max(finished_at) as finished_at from document_expiry_reminder_runs
      where status = any(%(successful)s::text[])) s
left join lateral (
    select status, started_at from document_expiry_reminder_runs
    order by started_at desc
    limit 1
) l on true;

-- count_run_history: what prune_run_history would delete (for --dry-run), and the database's cutoff
-- instant
select count(*), now() - %(older_than)s::interval from document_expiry_reminder_runs
where started_at < now() - %(older_than)s::interval;
