-- The admin list benchmark's ledger and outbox (bench/admin_list_bench.py), by name, loaded by
-- core.queries.load. It runs as the database owner, on a benchmark database only; the first
-- two take parameters (their % doubled), the last is three statements without any.

-- fill_ledger_markers: the ledger's markers: 4 thresholds per document, 3 documents per owner, written day by day over the last `days` days
insert into document_expiry_reminders
    (id, document_id, owner_user_id, type, threshold_days, expires_at, reminded_at,
     notified, run_id)
select gen_random_uuid(),
       md5('doc' || (i / 4))::uuid,
       md5('owner' || (i / 12))::uuid,
       (array['Passport', 'InternationalPassport', 'DriverLicense', 'ResidencePermit',
              'Visa'])[1 + (i / 4) %% 5],
       (array[30, 7, 1, 0])[1 + i %% 4],
       (day + 30)::date,
       day + interval '3 hours',
       i %% 4 = 1,
       md5('run' || day::date)::uuid
from generate_series(0, %(rows)s - 1) as i,
     lateral (select now()::date - %(days)s + (i::bigint * %(days)s / %(rows)s)::int
              as day) as d;

-- fill_outbox_week: a week of outbox: one message per owner a day, a few waiting, a few parked
insert into outbox_messages
    (id, aggregate_type, aggregate_id, event_type, contract_version, topic, message_key,
     payload, headers, created_at, published_at, attempts, last_error, parked_at)
select gen_random_uuid(), 'Profile', owner, 'DocumentExpiryReminderKafkaEvent', 1,
       'pin.profile.document-expiry-reminders.v1', owner,
       jsonb_build_object('ownerUserId', owner, 'documents', '[]'::jsonb),
       jsonb_build_object('event_type', 'DocumentExpiryReminderKafkaEvent'),
       created, case when i %% 100 <> 0 then created + interval '1 second' end,
       case when i %% 1000 = 0 then 10 else 1 end,
       case when i %% 1000 = 0 then 'MSG_SIZE_TOO_LARGE' end,
       case when i %% 1000 = 0 then created + interval '1 minute' end
from generate_series(0, %(messages)s - 1) as i,
     lateral (select md5('owner' || i)::uuid::text as owner,
                     now() - (i %% 7) * interval '1 day' - (i %% 997) * interval '1 second'
                     as created) as m;

-- outbox_as_relayed: the outbox as the relay leaves it (docs/outbox-relay.md): the waiting and parked ones in the slow lane, the published ones in the stream behind the position, one batch
update outbox_messages set detoured_at = created_at where published_at is null;
update outbox_messages set published_at = null where detoured_at is null;
update outbox_relay_position p set txid = l.txid, seq = l.seq
from (select txid, seq from outbox_messages order by txid desc, seq desc limit 1) l;
insert into outbox_relay_batches (upto_txid, upto_seq, published_at, messages)
select txid, seq, now(), (select count(*) from outbox_messages) from outbox_relay_position;
