"""The management commands as subprocesses, against real PostgreSQL."""
