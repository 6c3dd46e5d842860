-- The admin overview's own queries (reminders/overview.py), by name.
-- Blocks start with `-- name: description`. Parameters are %(name)s.

-- reminders_per_day: notified markers (reminders sent) per UTC day and threshold, from a UTC instant on
select (reminded_at at time zone 'UTC')::date as day, threshold_days, count(*) as reminders
from document_expiry_reminders
where reminded_at >= %(since)s
  and notified
group by 1, 2
order by 1, 2;

-- last_run: the most recent cycle of any instance, whatever its status, as the overview shows it
select run_id, status, started_at, duration_ms, reminders_sent, owners_notified, failed_owners
from document_expiry_reminder_runs
order by started_at desc
limit 1;

-- last_successful_run: the most recent cycle that did its work, as the overview shows it
select run_id, status, started_at, duration_ms, reminders_sent, owners_notified, failed_owners
from document_expiry_reminder_runs
where status = any(%(successful)s::text[])
order by started_at desc
limit 1;
