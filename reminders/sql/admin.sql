-- The admin's own queries (reminders/overview.py, reminders/admin.py), by name.
-- Blocks start with `-- name: description`. Parameters are %(name)s.

-- reminders_per_day: notified markers (reminders sent) per UTC day and threshold, from a UTC instant on
select (reminded_at at time zone 'UTC')::date as day, threshold_days, count(*) as reminders
from document_expiry_reminders
where reminded_at >= %(since)s
  and notified
group by 1, 2
order by 1, 2;

-- ledger_thresholds: the distinct thresholds in the ledger, by skipping through the threshold index
with recursive t(threshold_days) as (
    (select threshold_days from document_expiry_reminders order by threshold_days limit 1)
    union all
    select (select r.threshold_days from document_expiry_reminders r
            where r.threshold_days > t.threshold_days
            order by r.threshold_days limit 1)
    from t
    where t.threshold_days is not null
)
select threshold_days from t where threshold_days is not null order by threshold_days desc;
