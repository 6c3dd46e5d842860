-- Least-privilege database roles (docs/design.md §6). Idempotent: safe to re-run after each
-- migrate.
-- Passwords are not set here: production sets them out of band (ALTER ROLE ... PASSWORD).

do $$
begin
    if not exists (select from pg_roles where rolname = 'pin_reminder_worker') then
        create role pin_reminder_worker login;
    end if;
    if not exists (select from pg_roles where rolname = 'pin_outbox_relay') then
        create role pin_outbox_relay login;
    end if;
    if not exists (select from pg_roles where rolname = 'pin_admin_web') then
        create role pin_admin_web login;
    end if;
    if not exists (select from pg_roles where rolname = 'pin_reminder_auditor') then
        create role pin_reminder_auditor login;
    end if;
end
$$;

-- Each role finds the schema without the connection's `options` (a pooler such as PgBouncer
-- does not pass them on). No `public`: a function or operator another role planted there
-- would run as the role; pg_catalog is named so that it is searched after profile.
alter role pin_reminder_worker set search_path = profile, pg_catalog;
alter role pin_outbox_relay set search_path = profile, pg_catalog;
alter role pin_admin_web set search_path = profile, pg_catalog;
alter role pin_reminder_auditor set search_path = profile, pg_catalog;

-- Nobody creates in `public` but its owner (PostgreSQL 15's default, not a database created
-- under 14 or restored from one). Only the schema's owner or a superuser may revoke it.
do $$
begin
    if exists (select from pg_namespace
               where nspname = 'public'
                 and pg_has_role(current_user, nspowner, 'USAGE')) then
        revoke create on schema public from public;
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
-- claim rewrites (its arming counted in `armings`), never the key (document_id,
-- threshold_days) or the id.
grant update (owner_user_id, type, expires_at, reminded_at, notified, run_id, armings)
    on profile.document_expiry_reminders to pin_reminder_worker;
grant select, insert, update, delete on profile.document_expiry_reminder_runs to pin_reminder_worker;
-- The outbox: a row's place in the stream (txid, seq) is stamped by the database, never by a
-- writer (outbox migration 0006_stream_cluster): every column but those.
revoke insert on profile.outbox_messages from pin_reminder_worker;
grant insert (id, aggregate_type, aggregate_id, event_type, contract_version, topic,
              message_key, payload, headers, created_at, attempts)
    on profile.outbox_messages to pin_reminder_worker;
-- A row's id and body, never its headers: the claim skips a reminder the outbox already holds
-- under its message id (`on conflict (id) do nothing returning id` needs to see the id), and
-- refuses one whose stored body says something else (it reads back only what a claim wrote,
-- from columns of person_documents it reads anyway).
grant select (id, payload) on profile.outbox_messages to pin_reminder_worker;
-- The claim's refusal (reminders migration 0008_ledger_armings): it only raises.
grant execute on function profile.reminder_message_id_taken(uuid) to pin_reminder_worker;
-- A new row's headers are the outbox's (outbox migrations 0009_outbox_headers and
-- 0010_outbox_headers_aggregate: the five-argument form for a writer of the previous release),
-- the CloudEvents headers included (0014_cloudevents_headers: the seven-argument form calls them).
grant execute on function profile.outbox_headers(uuid, text, text, integer, jsonb),
                          profile.outbox_headers(uuid, text, text, integer, text, text, jsonb),
                          profile.outbox_cloudevents_headers(text, text, integer, text, timestamptz),
                          profile.outbox_cloudevents_name(text)
    to pin_reminder_worker;

-- The outbox relay: reads, marks and prunes the outbox; nothing else.
grant usage on schema profile to pin_outbox_relay;
-- It updates only the delivery bookkeeping, never a row's place in the stream (txid, seq).
revoke update on profile.outbox_messages from pin_outbox_relay;
grant select, delete on profile.outbox_messages to pin_outbox_relay;
grant update (published_at, attempts, last_error, available_at, parked_at, detoured_at)
    on profile.outbox_messages to pin_outbox_relay;
-- The stream's position (moved once per batch) and the batches' history (kept for retention).
grant select, update on profile.outbox_relay_position to pin_outbox_relay;
grant select, insert, delete on profile.outbox_relay_batches to pin_outbox_relay;
grant select on profile.outbox_message_states to pin_outbox_relay;
-- The reads send a row's headers as stored, or complete a row of the previous release's
-- (outbox migration 0014_cloudevents_headers).
grant execute on function
    profile.outbox_sent_headers(jsonb, uuid, text, integer, text, text, timestamptz),
    profile.outbox_cloudevents_headers(text, text, integer, text, timestamptz),
    profile.outbox_cloudevents_name(text)
    to pin_outbox_relay;
-- No grant for what the relay reads of the server (outbox/sql/queries.sql: its identity, which
-- must not be a server in recovery; pg_locks and pg_stat_activity for the lock's holder): every
-- role may. The outbox's guards (outbox migration 0013_stream_guards) run as their owner: the
-- trigger outbox_messages_behind_position and outbox_stream_settle() (SECURITY DEFINER, its
-- grant as before), whose subscription check reads only catalogs every role may read.
-- Each topic's partition count as the relay last saw it (outbox/topic.py).
grant select, insert, update on profile.outbox_topics to pin_outbox_relay;

-- Observability: the worker's metrics server reports the outbox backlog (so it stays visible
-- while the relay is down), reading only the bookkeeping timestamps (and, for the claim
-- above, the id and the payload), never the headers.
grant select (txid, seq, created_at, detoured_at, published_at, parked_at)
    on profile.outbox_messages to pin_reminder_worker;
grant select on profile.outbox_relay_position to pin_reminder_worker;
grant select (lane, state, txid, seq, created_at) on profile.outbox_message_states
    to pin_reminder_worker;

-- The admin web process (gunicorn): reads the ledger, the run history and the outbox; of
-- person_documents only what the overview's backlog census filters on (never payload_cipher,
-- never a write); updates only the outbox columns that re-queue sets (outbox/sql/queries.sql,
-- requeue_parked); keeps Django's sessions and admin log; and of users and groups only what a
-- login needs: it reads them and their permissions, and stamps last_login (and a password
-- rehashed when Django's hasher changes). Users and groups are managed with manage.py
-- admin_users under the owner's role, never through the admin.
grant usage on schema profile to pin_admin_web;
grant select on profile.document_expiry_reminders, profile.document_expiry_reminder_runs,
    profile.outbox_messages, profile.outbox_relay_position, profile.outbox_relay_batches,
    profile.outbox_message_states
    to pin_admin_web;
grant update (parked_at, attempts, available_at) on profile.outbox_messages
    to pin_admin_web;
revoke all on profile.person_documents from pin_admin_web;
grant select (id, status, deleted_at, expires_at) on profile.person_documents to pin_admin_web;
revoke all on profile.auth_user, profile.auth_group, profile.auth_user_groups,
    profile.auth_user_user_permissions, profile.auth_group_permissions from pin_admin_web;
grant select on profile.auth_user, profile.auth_group, profile.auth_user_groups,
    profile.auth_user_user_permissions, profile.auth_group_permissions to pin_admin_web;
grant update (last_login, password) on profile.auth_user to pin_admin_web;
grant select, insert, update, delete on profile.django_session to pin_admin_web;
grant select, insert, delete on profile.django_admin_log to pin_admin_web;
grant select on profile.django_content_type, profile.auth_permission to pin_admin_web;

-- The audit (manage.py audit_reminders): reads, never writes. Of person_documents what the
-- left-behind check filters on (never payload_cipher or number_mask); the ledger, the run
-- history, the outbox (and its states, for the backlog gauges its --loop serves) and the
-- relay's state whole. Its sessions are read-only as well.
grant usage on schema profile to pin_reminder_auditor;
revoke all on profile.person_documents from pin_reminder_auditor;
grant select (id, owner_user_id, expires_at, status, deleted_at, updated_at)
    on profile.person_documents to pin_reminder_auditor;
grant select on profile.document_expiry_reminders, profile.document_expiry_reminder_runs,
    profile.outbox_messages, profile.outbox_relay_position, profile.outbox_relay_batches,
    profile.outbox_message_states, profile.outbox_topics
    to pin_reminder_auditor;
alter role pin_reminder_auditor set default_transaction_read_only = on;
