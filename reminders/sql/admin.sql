-- The admin's own queries (reminders/overview.py), by name.
-- Blocks start with `-- name: description`. Parameters are %(name)s.

-- reminders_per_day: notified markers (reminders sent) per UTC day and threshold, from a UTC instant on
select (reminded_at at time zone 'UTC')::date as day, threshold_days, count(*) as reminders
from document_expiry_reminders
where reminded_at >= %(since)s
  and notified
group by 1, 2
order by 1, 2;
