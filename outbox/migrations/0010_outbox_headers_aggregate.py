"""A new row's headers carry its aggregate too (docs/outbox-relay.md, "The record's headers"):
`outbox_headers` gains the aggregate's type and id, so that the stream's read sends the stored
headers as they are instead of building them for every row it reads (that build was most of the
read's server time).

The five-argument form stays for a writer of the previous release (a rolling deploy): the reads
add the aggregate to a row stored without it, as they did before."""

from django.db import migrations

FORWARD_SQL = """
create function profile.outbox_headers(
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

REVERSE_SQL = """
drop function profile.outbox_headers(uuid, text, text, integer, text, text, jsonb);
"""


class Migration(migrations.Migration):

    dependencies = [
        ("outbox", "0009_outbox_headers"),
    ]

    operations = [migrations.RunSQL(FORWARD_SQL, REVERSE_SQL)]
