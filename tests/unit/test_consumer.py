"""`ride_out`: a TransferQueue call tried again while the controller is away, each
place's way of waiting kept as a parameter."""

from __future__ import annotations

import threading

import grpc
import pytest

from rljob.transferqueue.dataplane import TransferQueueError
from rljob.transferqueue.consumer import ride_out

AWAY = TransferQueueError(grpc.StatusCode.UNAVAILABLE, "restarting")
REFUSED = TransferQueueError(grpc.StatusCode.FAILED_PRECONDITION, "lease not held")


def answers(*outcomes):
    """A call that raises or returns each of `outcomes` in turn; and its call count."""
    calls = []

    def call():
        calls.append(1)
        out = outcomes[len(calls) - 1]
        if isinstance(out, Exception):
            raise out
        return out

    return call, calls


def test_it_waits_while_the_controller_is_away_and_tells_each_time():
    call, calls = answers(AWAY, AWAY, "answer")
    heard = []
    assert ride_out(call, away=heard.append, pause=0) == "answer"
    assert len(calls) == 3 and heard == [AWAY, AWAY]


def test_a_refusal_is_raised_unless_refusals_are_waited_out_too():
    call, _ = answers(REFUSED)
    with pytest.raises(TransferQueueError):
        ride_out(call, pause=0)
    call, calls = answers(REFUSED, AWAY, 7)
    heard = []
    assert ride_out(call, away=heard.append, pause=0, refusals=True) == 7
    assert heard == [REFUSED, AWAY]


def test_once_gives_up_after_the_first_pause():
    call, calls = answers(AWAY, "never asked")
    assert ride_out(call, once=True, pause=0) is None
    assert len(calls) == 1


def test_a_stop_cuts_the_pause_short_and_gives_up():
    stop = threading.Event()
    call, calls = answers(AWAY, AWAY, "never asked")
    stop.set()
    assert ride_out(call, stop=stop, pause=60) is None  # not a minute
    assert len(calls) == 1
