"""The outbox's own headers win over a writer's extra headers (docs/outbox-relay.md, "The record's
headers"): `outbox_headers(...)` used to end with `|| extra`, so an extra `message_id` (or event
type, contract version, correlation id, aggregate) replaced the outbox's, and a consumer
deduplicating by `message_id` would drop distinct reminders. Now the reserved keys are taken out
of `extra` first, in both forms (the five-argument one of the previous release too)."""

from django.db import migrations

from core.migration_ops import LockTimeoutMigration

FORWARD_SQL = """
set local lock_timeout = '5s';

create or replace function profile.outbox_headers(
    message_id uuid, correlation_id text, event_type text, contract_version integer,
    extra jsonb)
    returns jsonb language sql stable parallel safe as $$
    -- the aggregate's keys too: the reads add the row's own to headers stored without them
    select (coalesce(extra, '{}'::jsonb)
            - array['message_id', 'correlation_id', 'event_type', 'contract_version',
                    'aggregate_type', 'aggregate_id'])
           || pg_catalog.jsonb_build_object(
                  'message_id', message_id::text,
                  'correlation_id', correlation_id,
                  'event_type', event_type,
                  'contract_version', contract_version::text)
$$;

create or replace function profile.outbox_headers(
    message_id uuid, correlation_id text, event_type text, contract_version integer,
    aggregate_type text, aggregate_id text, extra jsonb)
    returns jsonb language sql stable parallel safe as $$
    select pg_catalog.jsonb_strip_nulls(
               (coalesce(extra, '{}'::jsonb)
                - array['message_id', 'correlation_id', 'event_type', 'contract_version',
                        'aggregate_type', 'aggregate_id'])
               || pg_catalog.jsonb_build_object(
                      'message_id', message_id::text,
                      'correlation_id', correlation_id,
                      'event_type', event_type,
                      'contract_version', contract_version::text,
                      'aggregate_type', aggregate_type,
                      'aggregate_id', aggregate_id))
$$;
"""

REVERSE_SQL = """
set local lock_timeout = '5s';

create or replace function profile.outbox_headers(
    message_id uuid, correlation_id text, event_type text, contract_version integer,
    extra jsonb)
    returns jsonb language sql stable parallel safe as $$
    select pg_catalog.jsonb_build_object(
               'message_id', message_id::text,
               'correlation_id', correlation_id,
               'event_type', event_type,
               'contract_version', contract_version::text)
           || coalesce(extra, '{}'::jsonb)
$$;

create or replace function profile.outbox_headers(
    message_id uuid, correlation_id text, event_type text, contract_version integer,
    aggregate_type text, aggregate_id text, extra jsonb)
    returns jsonb language sql stable parallel safe as $$
    select pg_catalog.jsonb_strip_nulls(
               pg_catalog.jsonb_build_object(
                   'message_id', message_id::text,
                   'correlation_id', correlation_id,
                   'event_type', event_type,
                   'contract_version', contract_version::text,
                   'aggregate_type', aggregate_type,
                   'aggregate_id', aggregate_id)
               || coalesce(extra, '{}'::jsonb))
$$;
"""


class Migration(LockTimeoutMigration):

    dependencies = [
        ("outbox", "0011_topic_partitions"),
    ]

    operations = [migrations.RunSQL(FORWARD_SQL, REVERSE_SQL)]
