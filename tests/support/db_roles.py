"""Run test queries as one of the least-privilege roles."""

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection


@contextmanager
def as_role(role: str) -> Iterator[None]:
    """Run the block's queries (this thread's connection) as `role`."""
    with connection.cursor() as cursor:
        cursor.execute(f"set role {role}")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("reset role")
