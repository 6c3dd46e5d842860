-- The schema every table of this project lives in (reached through search_path). Loaded by
-- core.apps before migrate writes anything, Django's own bookkeeping included.

-- create_profile_schema: create the `profile` schema if it is missing
create schema if not exists profile;
