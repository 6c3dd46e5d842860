"""A one-shot pass that stood by fails only when rows waited past the bound (outbox.one_pass)."""

import pytest

from outbox.one_pass import stood_by_while_rows_waited


@pytest.mark.parametrize(("stood_by", "oldest_waiting_s", "bound_s", "fails"), [
    (True, 300.0, 300.0, True),  # at the bound
    (True, 301.0, 300.0, True),
    (True, 299.9, 300.0, False),  # another relay is publishing them
    (True, None, 300.0, False),  # nothing waits
    (False, 10_000.0, 300.0, False),  # this pass led: its own outcome says what went wrong
    (True, 0.0, 0.0, True),  # a bound of 0: any waiting row
])
def test_a_pass_that_stood_by_fails_only_when_rows_waited_past_the_bound(
    stood_by: bool, oldest_waiting_s: float | None, bound_s: float, fails: bool
) -> None:
    assert stood_by_while_rows_waited(stood_by=stood_by, oldest_waiting_s=oldest_waiting_s,
                                      bound_s=bound_s) is fails
