-- The statements of core.db about the session itself. Blocks start with `-- name: description`.

-- backend_pid: the server process a statement reached (the probe for a pooler that pools by
-- transaction, where two client sessions reach the same one)
select pg_backend_pid();
