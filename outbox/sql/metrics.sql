-- Named queries of the outbox metrics. Loaded by outbox.metrics (reminders.queries.load).
-- They read only created_at, published_at and parked_at: the roles that scrape them need no
-- access to payloads or headers. `published_at is null` uses ix_outbox_messages_unpublished.

-- outbox_backlog: unpublished messages waiting for the relay, the age of the oldest, and parked ones
select count(*) filter (where parked_at is null) as unpublished,
       coalesce(extract(epoch from now() - min(created_at) filter (where parked_at is null)), 0)
           as oldest_unpublished_age_s,
       count(*) filter (where parked_at is not null) as parked
from outbox_messages
where published_at is null;
