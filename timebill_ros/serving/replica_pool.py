# SPDX-License-Identifier: Apache-2.0
"""The replica pool: each `vllm serve` replica's timing, its goals in flight, and routing.

ROS-free. Each replica has a timing model fitted online from what its streams showed:
time to first token against prompt tokens and requests running, inter-token latency
against requests running. The pool routes a goal to the replica with the earliest
predicted finish that meets its deadline, and keeps a replica that fails out for a while.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
import math
import threading
import time
from typing import Callable

import numpy as np
from scipy.optimize import nnls

from timebill_ros.serving.remote import RemoteAnswer

# Until a replica has shown this many streams, its timing model is the prior below.
MIN_SAMPLES = 3
KEPT_SAMPLES = 256
# A stream's weight in the fit halves with each this many seconds of newer streams: a
# replica's speed moves with what else its machine runs.
HALF_LIFE_S = 10.0
# A replica none of this node's goals ran on for this long, idle, is planned as fast as
# its fastest peer: its own figures are stale, and it gets a goal to refresh them.
STALE_S = 5.0
# The gaps between tokens of the goals streaming now, within this window, time the next
# goal's tokens (the fit scaled to them): after an overload the fit read far slower steps
# than the replica ran a few seconds later, and refused goals it then met.
LIVE_WINDOW_S = 2.0
LIVE_MIN_GAPS = 4
PRIOR_TTFT_S, PRIOR_TTFT_PER_TOKEN_S, PRIOR_ITL_S = 0.2, 0.001, 0.05
DOWN_FOR_S = 10.0  # a replica that failed is not chosen for this long


@dataclass(frozen=True)
class Load:
    """What else a replica runs when a goal starts there (goals beside it, not itself)."""

    running: int = 0  # in flight: they share its decode steps
    ahead: int = 0  # of those, with an earlier or equal deadline: served before it (EDF)
    ahead_tokens: int = 0  # prompt tokens of those ahead still to prefill


@dataclass(eq=False)
class InFlight:
    """One goal on a replica: its deadline, its prompt, whether its prefill is done.

    ``basis``, ``expected`` and ``cap``: its answer length as admission planned it (a
    replica_admission.LengthBasis, the median, the token cap), so the goals admitted after
    it can be weighed against its chance; ``tokens``: its tokens streamed so far.
    """

    deadline: float
    prompt_tokens: int
    load: Load = Load()  # what it started beside
    prefilled: bool = False
    token_times: deque = field(default_factory=lambda: deque(maxlen=16))  # pool clock
    started: float = 0.0  # pool clock
    tokens: int = 0
    basis: object = None
    expected: int = 1
    cap: int = 1

    def prefill_left_s(self, now: float, timing) -> float:
        """Return the time to its first token still predicted at ``now`` (0 once it came)."""
        return 0.0 if self.prefilled else max(
            0.0, timing.ttft_s(self.prompt_tokens, self.load) - (now - self.started))

    def rest_s(self, now: float, timing, beside: int) -> float:
        """Return when it is predicted to end from ``now``: its answer, or its Kill."""
        answer = self.prefill_left_s(now, timing) \
            + max(0, self.expected - self.tokens) * timing.itl_s(beside)
        return min(max(0.0, self.deadline - now), answer)


class ReplicaTiming:
    """A replica's time to first token and inter-token latency, refitted per stream.

    Replicas schedule by deadline (vLLM priority), so a goal's first token waits for the
    prefill of the goals ahead of it, not of those with later deadlines (a 2,000-token
    prompt ahead costs seconds on a CPU, a 30-token one little); every goal in flight
    shares the decode steps, so the time between tokens follows all of them, and so does
    the prefill's (its chunks share each step's token budget with their decode tokens).
    Without that term a replica's first tokens measured under load were read as its
    idle speed: two replicas here, one was left idle while the other took 39 of 40 goals.
    Newer streams weigh more (``HALF_LIFE_S``): with the old ones weighed alike, a
    replica measured slow early stayed slow in the fit after it had sped up.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        """Start from the prior (no samples)."""
        self.clock = clock
        # (prompt tokens, prompt tokens ahead to prefill, goals in flight beside, seconds,
        # when)
        self._ttft: list = []
        self._itl: list = []  # (goals running beside, seconds, when)
        self._lock = threading.Lock()
        self.ttft_coef = np.array([PRIOR_TTFT_S, PRIOR_TTFT_PER_TOKEN_S, 0.0, 0.0])
        self.itl_coef = np.array([PRIOR_ITL_S, 0.0])
        # The fastest first token and step seen: no prediction goes under them.
        self.ttft_floor_s = self.itl_floor_s = 0.0
        self.last_sample = -math.inf  # when the newest stream ended (clock)

    def observe(self, prompt_tokens: int, load: Load, answer: RemoteAnswer) -> None:
        """Learn from one finished stream (its TTFT and its median inter-token latency)."""
        if not answer.token_times:
            return
        with self._lock:
            self.last_sample = now = self.clock()
            self._ttft = (self._ttft + [(prompt_tokens, load.ahead_tokens, load.running,
                                         answer.ttft_s, now)])[-KEPT_SAMPLES:]
            gaps = answer.itl_s()
            if gaps:
                self._itl = (self._itl + [(load.running, float(np.median(gaps)), now)]
                             )[-KEPT_SAMPLES:]
            self._refit()

    def _refit(self) -> None:
        # Non-negative least squares: a term the samples do not vary (e.g. nothing ran
        # beside) stays at 0 instead of taking an arbitrary share.
        # Floors: after a burst the recent samples all ran beside many goals, and the fit
        # may put the whole time on the load term; alone, a goal was then predicted at
        # 0 s a step, and a 0.05-s goal of 25 tokens was accepted (CI, 2026-12-06).
        if len(self._ttft) >= MIN_SAMPLES:
            self.ttft_coef = _recent_fit([[1.0, n, r, k] for n, r, k, _, _ in self._ttft],
                                         [(t, when) for *_, t, when in self._ttft])
            self.ttft_floor_s = min(t for *_, t, _ in self._ttft)
        if len(self._itl) >= MIN_SAMPLES:
            self.itl_coef = _recent_fit([[1.0, r] for r, _, _ in self._itl],
                                        [(t, when) for _, t, when in self._itl])
            self.itl_floor_s = min(t for _, t, _ in self._itl)

    def ttft_s(self, prompt_tokens: int, load: Load = Load()) -> float:
        """Return the predicted time to the first token of a goal starting beside ``load``."""
        a, b, c, d = self.ttft_coef
        return max(self.ttft_floor_s,
                   float(a + b * prompt_tokens + c * load.ahead_tokens + d * load.running))

    def itl_s(self, running: int) -> float:
        """Return the predicted time between tokens with ``running`` goals beside."""
        a, b = self.itl_coef
        return max(self.itl_floor_s, float(a + b * running))

    def finish_s(self, prompt_tokens: int, tokens: int, load: Load = Load()) -> float:
        """Return the predicted time of a whole answer of ``tokens`` tokens."""
        return (self.ttft_s(prompt_tokens, load)
                + max(0, tokens - 1) * self.itl_s(load.running))

    def tokens_within(self, prompt_tokens: int, load: Load, seconds: float) -> int:
        """Return how many answer tokens are predicted to arrive within ``seconds``."""
        after_first = seconds - self.ttft_s(prompt_tokens, load)
        if after_first < 0.0:
            return 0
        return 1 + int(after_first / max(self.itl_s(load.running), 1e-6))

    def prefill_s(self, prompt_tokens: int) -> float:
        """Return the time a prompt's prefill adds to the steps of the goals beside it."""
        return float(self.ttft_coef[1] * prompt_tokens)


class LiveTiming:
    """A replica's fitted timing with its steps scaled to the gaps its streams show now."""

    def __init__(self, fitted: ReplicaTiming, factor: float):
        """Scale ``fitted``'s inter-token latency by ``factor``."""
        self.fitted, self.factor = fitted, factor

    def ttft_s(self, prompt_tokens: int, load: Load = Load()) -> float:
        """Return the fitted time to the first token."""
        return self.fitted.ttft_s(prompt_tokens, load)

    def itl_s(self, running: int) -> float:
        """Return the fitted time between tokens, scaled to the live gaps."""
        return self.fitted.itl_s(running) * self.factor

    def prefill_s(self, prompt_tokens: int) -> float:
        """Return the fitted prefill time a prompt adds to the steps beside it."""
        return self.fitted.prefill_s(prompt_tokens)

    finish_s = ReplicaTiming.finish_s
    tokens_within = ReplicaTiming.tokens_within


def _recent_fit(rows: list, targets: list) -> np.ndarray:
    """Return the NNLS fit of (seconds, when) targets, a stream weighing less as it ages."""
    newest = max(when for _, when in targets)
    weights = np.sqrt([0.5 ** ((newest - when) / HALF_LIFE_S) for _, when in targets])
    coef, _ = nnls(np.array(rows) * weights[:, None],
                   np.array([t for t, _ in targets]) * weights)
    return coef


@dataclass(frozen=True)
class Route:
    """Where a goal would run: the replica, its predicted finish, and what that is timed on.

    ``timing``: the replica's own fit, scaled to the gaps its streams show now, or a
    fresher peer's; ``stand_in`` says which (empty: the plain fit). ``wait_s``: how long
    the goal waits for a seat there (``seconds`` includes it).
    """

    replica: object
    seconds: float
    load: Load
    timing: object = None
    stand_in: str = ''
    wait_s: float = 0.0

    def __post_init__(self):
        """Take the replica's own timing when none is given."""
        if self.timing is None and self.replica is not None:
            object.__setattr__(self, 'timing', self.replica.timing)


@dataclass
class Replica:
    """One `vllm serve` endpoint and what the node knows of it."""

    url: str
    timing: ReplicaTiming = field(default_factory=ReplicaTiming)
    inflight: list = field(default_factory=list)  # InFlight goals (deadlines: pool clock)
    down_until: float = 0.0
    last_error: str = ''

    @property
    def running(self) -> int:
        """Return how many goals are in flight here."""
        return len(self.inflight)

    def live_gap_s(self, now: float) -> float | None:
        """Return the median gap between tokens streamed here lately (None: too few)."""
        gaps = [b - a for goal in self.inflight
                for a, b in zip(goal.token_times, list(goal.token_times)[1:])
                if a >= now - LIVE_WINDOW_S]
        return float(np.median(gaps)) if len(gaps) >= LIVE_MIN_GAPS else None

    def seat_wait_s(self, now: float, timing, seats: int) -> float:
        """Return how long a goal starting now waits for one of the replica's ``seats``.

        vLLM runs at most ``--max-num-seqs`` requests; a request beyond them waits for
        one to end (a waiting request does not preempt a running one: it is preempted only
        when KV blocks run out). Each goal in flight ends by its answer or by its Kill.
        """
        beyond = self.running - seats
        if seats <= 0 or beyond < 0:
            return 0.0
        ends = sorted(goal.rest_s(now, timing, self.running - 1) for goal in self.inflight)
        return ends[beyond]

    def load(self, deadline: float) -> Load:
        """Return the load a goal with ``deadline`` would start beside."""
        ahead = [goal for goal in self.inflight if goal.deadline <= deadline]
        return Load(len(self.inflight), len(ahead),
                    sum(goal.prompt_tokens for goal in ahead if not goal.prefilled))


class ReplicaPool:
    """Route goals to replicas by predicted finish; mark failing ones down for a while."""

    def __init__(self, urls, clock: Callable[[], float] = time.monotonic, seats: int = 0):
        """Hold one Replica per URL (``http://host:port``).

        ``seats``: the requests each replica runs at once (its ``--max-num-seqs``; 0:
        not known, no wait for a seat is predicted).
        """
        self.replicas = [Replica(url.rstrip('/'), ReplicaTiming(clock)) for url in urls]
        self.clock = clock
        self.seats = seats
        self._lock = threading.Lock()

    def routes(self, prompt_tokens: int, tokens: int, deadline: float = math.inf) -> list:
        """Return a Route through each replica up, earliest predicted finish first.

        A replica whose figures are stale (``STALE_S``) and that runs none of this node's
        goals is timed as its fastest peer would be: it gets the goal when that is the
        earliest, and its own figures are fresh again after it (exploration, bounded by
        Kill).
        """
        now = self.clock()
        with self._lock:
            up = [replica for replica in self.replicas if replica.down_until <= now]
            routes = [self._route(replica, up, prompt_tokens, tokens, deadline, now)
                      for replica in up]
        return sorted(routes, key=lambda route: (route.seconds, self.replicas.index(
            route.replica)))

    def earliest(self, prompt_tokens: int, tokens: int, deadline: float = math.inf) -> Route:
        """Return the Route of the earliest predicted finish (Route(None, inf) if none up)."""
        routes = self.routes(prompt_tokens, tokens, deadline)
        return routes[0] if routes else Route(None, float('inf'), Load())

    def _route(self, replica: Replica, up: list, prompt_tokens: int, tokens: int,
               deadline: float, now: float) -> Route:
        """Return the route through ``replica`` (its own timing, or a peer's when stale)."""
        load = replica.load(deadline)
        timing, why = replica.timing, ''
        live = replica.live_gap_s(now)
        if live is not None:  # the goals streaming ran with one fewer beside than this one
            factor = min(20.0, max(0.05, live / max(timing.itl_s(load.running - 1), 1e-6)))
            timing = LiveTiming(timing, factor)
            why = f'steps timed on the gaps streaming now ({1e3 * live:.0f} ms)'
        wait = replica.seat_wait_s(now, timing, self.seats)
        if wait > 0.0:
            why = '; '.join(filter(None, (why, f'{wait:.3f} s waiting for one of its '
                                               f'{self.seats} seats')))
        route = Route(replica, wait + timing.finish_s(prompt_tokens, tokens, load), load,
                      timing, why, wait)
        age = now - replica.timing.last_sample
        if replica.running or age < STALE_S:
            return route
        for peer in up:
            seconds = peer.timing.finish_s(prompt_tokens, tokens, load)
            if peer.timing.last_sample > replica.timing.last_sample and seconds < route.seconds:
                route = Route(replica, seconds, load, peer.timing,
                              f'no stream for {age:.1f} s: timed as {peer.url}')
        return route

    def down_reasons(self) -> str:
        """Return why the replicas that are down are down, in one line."""
        now = self.clock()
        with self._lock:
            return '; '.join(f'{r.url}: {r.last_error}' for r in self.replicas
                             if r.down_until > now) or 'none down'

    def mark_down(self, replica: Replica, why: str) -> None:
        """Leave ``replica`` out of routing for ``DOWN_FOR_S``."""
        with self._lock:
            replica.down_until = self.clock() + DOWN_FOR_S
            replica.last_error = why

    def started(self, replica: Replica, deadline: float = math.inf,
                prompt_tokens: int = 0, **answer) -> InFlight:
        """Count a goal in flight on ``replica``; return it (with the load beside it).

        ``answer``: InFlight's answer fields (``tokens`` so far, ``basis``, ``expected``,
        ``cap``).
        """
        with self._lock:
            goal = InFlight(deadline, prompt_tokens, replica.load(deadline),
                            started=self.clock(), **answer)
            replica.inflight.append(goal)
            return goal

    def token(self, goal: InFlight) -> None:
        """Note a token of ``goal`` streamed now.

        The first ends its prefill: it no longer delays the goals behind it.
        """
        now = self.clock()
        with self._lock:
            goal.prefilled = True
            goal.tokens += 1
            goal.token_times.append(now)

    def ended(self, replica: Replica, answer: RemoteAnswer, goal: InFlight) -> None:
        """Take a goal off ``replica``: learn its timing, or mark the replica down."""
        with self._lock:
            replica.inflight.remove(goal)
        if answer.ended == 'failed' and not answer.refused_goal:
            self.mark_down(replica, answer.error)
        else:
            replica.timing.observe(goal.prompt_tokens, goal.load, answer)
