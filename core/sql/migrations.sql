-- What a migration that timed out on its lock reports (core.migration_ops). Blocks start with
-- `-- name: description`.

-- lock_holders: the other sessions holding a lock on a table the failed statement names
-- (no query text: it may carry personal data)
select c.oid::regclass::text as relation, l.mode, l.pid,
       coalesce(nullif(a.application_name, ''), '?') as application_name,
       coalesce(a.state, '?') as state,
       extract(epoch from pg_catalog.now() - a.xact_start)::bigint as transaction_seconds
  from pg_catalog.pg_locks l
  join pg_catalog.pg_class c on c.oid = l.relation
  left join pg_catalog.pg_stat_activity a on a.pid = l.pid
 where l.granted
   and l.pid <> pg_catalog.pg_backend_pid()
   and l.database = (select oid from pg_catalog.pg_database where datname = pg_catalog.current_database())
   and c.relkind in ('r', 'p', 'i', 'm')
   and %(statement)s ~* ('\m' || c.relname || '\M')
 order by relation, l.pid;
