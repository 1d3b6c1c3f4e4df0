"""The event queue's one ordering key: (time_s, priority, seq)."""

from jigsawrl.sim.kernel import PRIO_ARRIVAL, PRIO_FINISH, PRIO_WAKE, EventQueue


def test_order_time_then_priority_then_seq() -> None:
    q = EventQueue()
    q.schedule(2.0, "late")
    q.schedule(1.0, "wake", PRIO_WAKE)
    q.schedule(1.0, "arrival-1", PRIO_ARRIVAL)
    q.schedule(1.0, "finish", PRIO_FINISH)
    q.schedule(1.0, "arrival-2", PRIO_ARRIVAL)
    got = []
    while (e := q.pop()) is not None:
        got.append((e.time_s, e.payload))
    assert got == [(1.0, "finish"), (1.0, "arrival-1"), (1.0, "arrival-2"), (1.0, "wake"),
                   (2.0, "late")]
    assert q.now_s == 2.0


def test_cancel_and_past_clamp() -> None:
    q = EventQueue()
    a = q.schedule(1.0, "a")
    q.schedule(3.0, "b")
    q.cancel(a)
    assert len(q) == 1
    assert q.peek_time() == 3.0
    assert q.pop().payload == "b"
    late = q.schedule(1.0, "past")  # never before now
    assert late.time_s == 3.0
    assert q.pop().payload == "past"
    assert q.pop() is None
