"""Every record also carries the CloudEvents 1.0 Kafka binary-mode headers
(docs/contracts/document-expiry-reminder.md, "CloudEvents"; docs/outbox-relay.md, "The record's
headers"), so that a CloudEvents consumer (an SDK's Kafka binding, Knative, Dapr) reads the events
without code of ours:

- `outbox_cloudevents_headers(...)` builds them: `ce_specversion` 1.0, `ce_id` = the message id,
  `ce_source` and `ce_type` named after the event type (`ce_type` with the contract version),
  `ce_time` (RFC 3339, UTC), `ce_subject` = the aggregate's id (the owner), and `content-type`
  application/json.
- The seven-argument `outbox_headers` (the worker's insert, of this release and the previous
  one) stores them with the rest, its `ce_time` the insert's `now()` (the row's `created_at` as
  the worker writes it); a writer's extra headers never replace them, nor pass for them in the
  five-argument form's rows.
- `outbox_sent_headers(...)`, the one function both relay reads (`read_stream`, `read_slow`)
  call, sends a row's headers as stored, or completes a row stored without them (before this
  migration, or by the five-argument form) from the row's own columns.
"""

from django.db import migrations

from core.migration_ops import LockTimeoutMigration

CE_KEYS = "'ce_specversion', 'ce_id', 'ce_source', 'ce_type', 'ce_time', 'ce_subject', 'content-type'"

FORWARD_SQL = f"""
set local lock_timeout = '5s';

-- DocumentExpiryReminderKafkaEvent -> document-expiry-reminder: the name ce_source and ce_type
-- carry (contract, "CloudEvents"); the known type spelled out, as the two regular expressions
-- cost about 45 us a row (a read completing 0.1.0's rows, an insert)
create function profile.outbox_cloudevents_name(event_type text)
    returns text language sql immutable parallel safe as $$
    select case event_type
               when 'DocumentExpiryReminderKafkaEvent' then 'document-expiry-reminder'
               else pg_catalog.lower(pg_catalog.regexp_replace(
                        pg_catalog.regexp_replace(event_type, 'KafkaEvent$', ''),
                        '([a-z0-9])([A-Z])', '\\1-\\2', 'g'))
           end
$$;

create function profile.outbox_cloudevents_headers(
    message_id text, event_type text, contract_version integer, subject text,
    event_time timestamptz)
    returns jsonb language sql stable parallel safe as $$
    select pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object(
               'ce_specversion', '1.0',
               'ce_id', message_id,
               'ce_source', '/pin/profile/' || profile.outbox_cloudevents_name(event_type),
               'ce_type', 'pin.profile.' || profile.outbox_cloudevents_name(event_type)
                          || '.v' || contract_version::text,
               'ce_time', pg_catalog.to_char(event_time at time zone 'UTC',
                                             'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
               'ce_subject', subject,
               'content-type', 'application/json'))
$$;

-- The five-argument form stores no CloudEvents headers (the reads complete its rows), and a
-- writer's extra ones never pass for the outbox's: a stored ce_id is always the outbox's own.
create or replace function profile.outbox_headers(
    message_id uuid, correlation_id text, event_type text, contract_version integer,
    extra jsonb)
    returns jsonb language sql stable parallel safe as $$
    select (coalesce(extra, '{{}}'::jsonb)
            - array['message_id', 'correlation_id', 'event_type', 'contract_version',
                    'aggregate_type', 'aggregate_id', {CE_KEYS}])
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
               (coalesce(extra, '{{}}'::jsonb)
                - array['message_id', 'correlation_id', 'event_type', 'contract_version',
                        'aggregate_type', 'aggregate_id', {CE_KEYS}])
               || pg_catalog.jsonb_build_object(
                      'message_id', message_id::text,
                      'correlation_id', correlation_id,
                      'event_type', event_type,
                      'contract_version', contract_version::text,
                      'aggregate_type', aggregate_type,
                      'aggregate_id', aggregate_id))
           -- now(): the row's created_at as the worker writes it, so ce_time is the record's
           -- Kafka timestamp (to the millisecond) and the same as a read would complete it
           || profile.outbox_cloudevents_headers(message_id::text, event_type, contract_version,
                                                 aggregate_id, now())
$$;

-- A row's headers as the relay sends them (outbox/sql/queries.sql, read_stream and read_slow).
create function profile.outbox_sent_headers(
    headers jsonb, id uuid, event_type text, contract_version integer, aggregate_type text,
    aggregate_id text, created_at timestamptz)
    returns jsonb language sql stable parallel safe as $$
    select case when headers ? 'ce_id' then headers
                -- a row of release 0.1.0 (stored before this migration, without the CloudEvents
                -- headers and perhaps without its aggregate): remove in release 0.3.0, with a
                -- migration that completes the stored headers of the rows not published yet
                else pg_catalog.jsonb_strip_nulls(
                         pg_catalog.jsonb_build_object('aggregate_type', aggregate_type,
                                                       'aggregate_id', aggregate_id)
                         || (headers - array[{CE_KEYS}]))
                     || profile.outbox_cloudevents_headers(
                            coalesce(headers ->> 'message_id', id::text), event_type,
                            contract_version, aggregate_id, created_at)
           end
$$;
"""

REVERSE_SQL = """
set local lock_timeout = '5s';

drop function profile.outbox_sent_headers(jsonb, uuid, text, integer, text, text, timestamptz);

create or replace function profile.outbox_headers(
    message_id uuid, correlation_id text, event_type text, contract_version integer,
    extra jsonb)
    returns jsonb language sql stable parallel safe as $$
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

drop function profile.outbox_cloudevents_headers(text, text, integer, text, timestamptz);
drop function profile.outbox_cloudevents_name(text);
"""


class Migration(LockTimeoutMigration):

    dependencies = [
        ("outbox", "0013_stream_guards"),
    ]

    operations = [migrations.RunSQL(FORWARD_SQL, REVERSE_SQL)]
