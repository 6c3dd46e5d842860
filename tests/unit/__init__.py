"""Pure logic: no database, no processes."""
