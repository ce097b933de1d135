"""The generator model's ``Messenger``: its posted calls run in order on its own thread, and while the
model is busy it finds cancelled requests (the real Triton path: ``test_generator_triton.py``)."""

from __future__ import annotations

import threading
import time

from slimserve.triton_models.generator import Messenger, Pending

DEADLINE_S = 10.0


class Sender:
    """What the messenger asks of a Triton response sender: ``is_cancelled``."""

    def __init__(self, raises=False):
        self.cancelled = threading.Event()
        self.raises = raises

    def is_cancelled(self):
        if self.raises:
            raise RuntimeError("the request was released")
        return self.cancelled.is_set()


def pending(sender):
    return Pending(request=None, sender=sender, job=None, arrived=0.0)


def wait_until(condition):
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.005)


def test_posted_calls_run_in_order_on_the_messengers_thread_and_a_failure_stops_none():
    made, threads = [], set()

    def record(value):
        made.append(value)
        threads.add(threading.current_thread().name)

    def fail():
        raise RuntimeError("the client went away")

    messenger = Messenger(lambda: [], check_interval_s=0.01)
    for value in range(50):
        messenger.post(record, value)
        if value == 10:
            messenger.post(fail)
    messenger.close()
    assert made == list(range(50))
    assert threads == {"generator-messenger"}
    assert not messenger.thread.is_alive()


def test_while_busy_it_marks_the_cancelled_requests_and_only_those():
    running = pending(Sender())
    victim = pending(Sender())
    released = pending(Sender(raises=True))
    messenger = Messenger(lambda: [running, victim, released], check_interval_s=0.005)
    try:
        messenger.busy.set()
        victim.sender.cancelled.set()
        messenger.post(lambda: None)  # wakes it, as the decoding loop's first response would
        wait_until(lambda: victim.cancelled)
        assert not running.cancelled
        assert not released.cancelled  # a request that can no longer answer counts as not cancelled
    finally:
        messenger.close()
