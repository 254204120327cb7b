# SPDX-License-Identifier: Apache-2.0
"""Feedback pacing: fewer messages, the same text, the newest token's index and times."""

from timebill_ros.core.execution import TokenEvent
from timebill_ros.core.feedback import FeedbackPacer
from timebill_ros.core.planning import Plan

PLAN = Plan()


def stream(pacer, times, flush=True):
    """Feed one token per time (text 't<index>'), then flush as a result would."""
    for index, at in enumerate(times):
        pacer(TokenEvent(index=index, token_id=index, text_delta=f't{index} ', time=at),
              at - 10.0, 20.0 - at, PLAN)
    if flush:
        pacer.flush()


def test_period_zero_sends_every_token_as_it_comes():
    sent = []
    stream(FeedbackPacer(0.0, lambda *args: sent.append(args)), [10.0, 10.008, 10.016])
    assert [event.index for event, *_ in sent] == [0, 1, 2]
    assert [event.text_delta for event, *_ in sent] == ['t0 ', 't1 ', 't2 ']


def test_tokens_within_a_period_go_out_together_with_the_newest_ones_times():
    sent = []
    times = [10.0 + 0.008 * i for i in range(10)]  # 8-ms steps, a 20-ms period
    stream(FeedbackPacer(0.02, lambda *args: sent.append(args)), times)
    # The first at once, then one message per 20 ms (every third token), then the rest.
    assert [event.index for event, *_ in sent] == [0, 3, 6, 9]
    assert [event.text_delta for event, *_ in sent] == [
        't0 ', 't1 t2 t3 ', 't4 t5 t6 ', 't7 t8 t9 ']
    event, elapsed, remaining, plan = sent[1]
    assert event.time == times[3] and elapsed == times[3] - 10.0 and remaining == 20.0 - times[3]
    assert plan is PLAN


def test_flush_sends_the_held_tokens_and_then_nothing():
    sent = []
    pacer = FeedbackPacer(1.0, lambda *args: sent.append(args))
    stream(pacer, [10.0, 10.1, 10.2], flush=False)
    assert [event.index for event, *_ in sent] == [0]
    pacer.flush()
    assert [(event.index, event.text_delta) for event, *_ in sent] == [(0, 't0 '), (2, 't1 t2 ')]
    pacer.flush()
    assert len(sent) == 2
    assert ''.join(event.text_delta for event, *_ in sent) == 't0 t1 t2 '
