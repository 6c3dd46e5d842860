"""Real PostgreSQL, in process."""
