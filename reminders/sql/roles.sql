-- Least-privilege database roles (DESIGN 5). Idempotent: safe to re-run after each migrate.
-- Passwords are not set here: production sets them out of band (ALTER ROLE ... PASSWORD).

do $$
begin
    if not exists (select from pg_roles where rolname = 'pin_reminder_worker') then
        create role pin_reminder_worker login;
    end if;
    if not exists (select from pg_roles where rolname = 'pin_outbox_relay') then
        create role pin_outbox_relay login;
    end if;
end
$$;

-- The reminder worker: reads only the open columns of person_documents (payload_cipher is
-- unreadable, the table unwritable), owns the ledger and the run history, appends to the outbox.
grant usage on schema profile to pin_reminder_worker;
revoke all on profile.person_documents from pin_reminder_worker;
grant select (id, owner_user_id, person_id, type, number_mask, expires_at, status, deleted_at)
    on profile.person_documents to pin_reminder_worker;
grant select, insert, delete on profile.document_expiry_reminders to pin_reminder_worker;
-- A renewed document's markers are re-armed in place (on conflict do update): the columns a
-- claim rewrites, never the key (document_id, threshold_days) or the id.
grant update (owner_user_id, type, expires_at, reminded_at, notified, run_id)
    on profile.document_expiry_reminders to pin_reminder_worker;
grant select, insert, update, delete on profile.document_expiry_reminder_runs to pin_reminder_worker;
grant insert on profile.outbox_messages to pin_reminder_worker;

-- The outbox relay: reads, marks and prunes the outbox; nothing else.
grant usage on schema profile to pin_outbox_relay;
grant select, update, delete on profile.outbox_messages to pin_outbox_relay;

-- Observability: the worker's metrics server reports the outbox backlog (so it stays visible
-- while the relay is down), reading only the bookkeeping timestamps, never payload or headers.
grant select (created_at, published_at, parked_at) on profile.outbox_messages to pin_reminder_worker;
