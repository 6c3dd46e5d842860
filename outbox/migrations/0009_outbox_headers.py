"""The outbox owns its rows' headers (docs/outbox-relay.md, "The record's headers"): the function
`outbox_headers` builds a new row's headers (its message id, the correlation id, the event type
and the contract version, and the writer's extra headers such as `traceparent`), so that a
writer (the worker's insert) never spells the outbox's header conventions itself, and the
relay's reads send what was stored. Rows written before it that lack a `message_id` header and
are not published yet get it here, as the reads used to add it."""

from django.db import migrations

FORWARD_SQL = """
create function profile.outbox_headers(
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

update profile.outbox_messages m
set headers = pg_catalog.jsonb_build_object('message_id', m.id::text) || m.headers
where not m.headers ? 'message_id'
  and m.id in (select s.id from profile.outbox_message_states s where s.state <> 'published');
"""

REVERSE_SQL = "drop function profile.outbox_headers(uuid, text, text, integer, jsonb);"


class Migration(migrations.Migration):

    dependencies = [
        ("outbox", "0008_message_states"),
    ]

    operations = [migrations.RunSQL(FORWARD_SQL, REVERSE_SQL)]
