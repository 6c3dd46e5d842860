-- The readiness probe's query (core.health). Blocks start with `-- name: description`.

-- database_ready: the cheapest statement the server must answer
select 1;
