"""audit.against_topic.reconcile: the window's outbox rows against the records read from the topic."""

from audit.against_topic import TopicEvent, TopicRecord, reconcile


def row(id_: str, key: str = "k", published: bool = True) -> TopicEvent:
    return TopicEvent(id_, key, "t", published)


def record(id_: str, offset: int, key: str = "k", partition: int = 0) -> TopicRecord:
    return TopicRecord(id_, key, partition, offset, 0)


def nothing_else(_ids: list[str]) -> set[str]:
    return set()


def test_the_same_rows_and_records_reconcile() -> None:
    result = reconcile([row("a"), row("b")], [record("a", 0), record("b", 1)], nothing_else)
    assert (result.missing, result.unknown, result.duplicated, result.out_of_order) == (
        [], [], [], [])


def test_an_unpublished_row_is_not_missing_but_a_published_one_is() -> None:
    result = reconcile([row("a"), row("b", published=False), row("c")], [record("a", 0)],
                       nothing_else)
    assert result.missing == ["c"]


def test_a_record_of_a_row_outside_the_window_is_known_and_a_stranger_is_not() -> None:
    result = reconcile([row("a")], [record("a", 0), record("x", 1), record("y", 2)],
                       lambda ids: {"x"} & set(ids))
    assert result.unknown == ["y"]


def test_duplicates_count_copies_and_order_is_of_first_copies() -> None:
    rows = [row("a"), row("b"), row("c", key="other")]
    records = [record("a", 0), record("b", 1), record("a", 2), record("c", 0, "other", 1)]
    result = reconcile(rows, records, nothing_else)
    assert result.duplicated == [("a", 2)] and result.out_of_order == []

    swapped = reconcile(rows, [record("b", 0), record("a", 1), record("c", 0, "other", 1)],
                        nothing_else)
    assert swapped.out_of_order == ["k"]


def test_a_missing_record_does_not_make_its_key_out_of_order() -> None:
    result = reconcile([row("a"), row("b"), row("c")], [record("a", 0), record("c", 1)],
                       nothing_else)
    assert result.missing == ["b"] and result.out_of_order == []
