-- profile.person_documents, exactly as the profile service owns it in production (docs/design.md §2.1).
-- This repository never migrates it: dev, test, demo and benchmark databases create it from
-- this script (manage.py create_dev_person_documents). Idempotent.
create schema if not exists profile;

create table if not exists profile.person_documents (
    id              uuid primary key,
    owner_user_id   uuid not null,
    person_id       uuid not null,
    type            varchar(32) not null,
    number_mask     varchar(32) null,
    expires_at      timestamptz null,
    status          varchar(16) not null,
    deleted_at      timestamptz null,
    payload_cipher  bytea not null,
    created_at      timestamptz not null,
    updated_at      timestamptz not null
);

create index if not exists ix_person_documents_expires_at
    on profile.person_documents (expires_at) where expires_at is not null;
create index if not exists ix_person_documents_owner_user_id
    on profile.person_documents (owner_user_id);
