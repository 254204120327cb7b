# SPDX-License-Identifier: Apache-2.0
"""Remote engines: `vllm serve` replicas over the OpenAI-compatible API, bound by deadlines.

ROS-free. A replica streams a chat completion as Server-Sent Events; this module sends
one goal to one replica with the deadline turned into vLLM's ``priority`` (smaller is
served first, so an absolute deadline in ms gives EDF inside the replica), the plan's
token cap as ``max_tokens`` and the goal's answer form (stop strings, sampling, a JSON
Schema or GBNF as ``structured_outputs``). At the deadline it closes the connection,
which is how vLLM aborts a request and frees its KV cache (docs/design/
vllm_backend_notes.md, section 3): a Kill is late by at most one token plus the network.

The replicas' timing and routing live in serving/replica_pool.py; the goal's rules
(Kill, cancel, Skip-Next) in the per-goal run the replica executor feeds each delta to.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
import json
import threading
import time
from typing import Callable

import httpx

# How long a Kill waits for a feedback call in progress (one normally takes under 1 ms).
DELIVERY_GRACE_S = 0.05


@dataclass(frozen=True)
class RemoteGoal:
    """What one goal asks a replica for (the chat messages are built by the caller)."""

    messages: tuple  # ({'role': ..., 'content': ...}, ...)
    max_tokens: int
    stop: tuple = ()
    temperature: float = 0.0
    top_p: float = 0.0
    seed: int = 0
    json_schema: str = ''
    grammar: str = ''
    # The answer so far, when a goal moves to another replica: that replica continues it.
    prefix: str = ''

    def body(self, model: str, priority: int) -> dict:
        """Return the /v1/chat/completions request body."""
        body = {'model': model, 'messages': list(self.messages), 'stream': True,
                'stream_options': {'include_usage': True}, 'max_tokens': self.max_tokens,
                'temperature': self.temperature, 'priority': priority}
        if self.prefix:  # vLLM continues the last (assistant) message instead of a new one
            body['messages'].append({'role': 'assistant', 'content': self.prefix})
            body.update(add_generation_prompt=False, continue_final_message=True)
        if self.top_p > 0.0:
            body['top_p'] = self.top_p
        if self.seed:
            body['seed'] = self.seed
        if self.stop:
            body['stop'] = list(self.stop)
        if self.json_schema:  # the `guided_*` names are ignored by vLLM >= 0.12
            body['structured_outputs'] = {'json': json.loads(self.json_schema)}
        elif self.grammar:
            body['structured_outputs'] = {'grammar': self.grammar}
        return body


@dataclass
class RemoteAnswer:
    """What came back of one streamed goal."""

    text: str = ''
    tokens: int = 0
    finish_reason: str = ''  # vLLM's ('stop', 'length'), or '' when cut
    ended: str = 'completed'  # completed | stopped | killed | canceled | failed
    error: str = ''
    ttft_s: float = 0.0
    token_times: list = field(default_factory=list)  # monotonic time of each chunk
    started: float = 0.0
    finished: float = 0.0
    prompt_tokens: int = 0
    status: int = 0  # the replica's HTTP status (0: none came)

    @property
    def refused_goal(self) -> bool:
        """Tell whether the replica refused the goal itself (HTTP 4xx).

        Too long a prompt or a bad schema: another replica of the pool would refuse it too.
        """
        return 400 <= self.status < 500 and self.status not in (408, 429)

    def itl_s(self) -> list:
        """Return the inter-token latencies the stream showed."""
        times = self.token_times
        return [b - a for a, b in zip(times, times[1:])]


def joined(first: RemoteAnswer, rest: RemoteAnswer) -> RemoteAnswer:
    """Return one answer of ``first`` continued by ``rest`` (a goal moved to a replica)."""
    return replace(rest, text=first.text + rest.text, tokens=first.tokens + rest.tokens,
                   ttft_s=first.ttft_s if first.tokens else rest.ttft_s + rest.started
                   - first.started, token_times=first.token_times + rest.token_times,
                   started=first.started, prompt_tokens=first.prompt_tokens)


def stream_goal(client: httpx.Client, url: str, body: dict, deadline: float,
                on_delta: Callable[[str], bool | None] = lambda text: True,
                canceled: Callable[[], bool] = lambda: False,
                clock: Callable[[], float] = time.monotonic) -> RemoteAnswer:
    """Stream one chat completion until it ends, the deadline passes or it is stopped.

    ``deadline`` is on ``clock``: the latest the stream may go on (no token by then:
    'killed'). ``on_delta`` gets each token's text and returns False to stop there (the
    goal's rules at a token boundary: 'stopped'); ``canceled`` is polled between events
    ('canceled'). The stream is read on its own thread; a Kill returns at once with the
    text so far and closes the connection in the background, which aborts the request
    in vLLM (closing can take a while when the replica is busy). Errors (connection
    refused, HTTP or in-stream errors) end it as 'failed' with the reason; nothing is
    raised.
    """
    answer = RemoteAnswer(started=clock())
    state = _Stream(answer, on_delta, canceled, clock)
    reader = threading.Thread(target=state.read, args=(client, url, body), daemon=True,
                              name='timebill-remote-stream')
    reader.start()
    if state.done.wait(max(0.0, deadline - clock())):
        answer.finished = answer.finished or clock()
        return answer
    return state.kill()


class _Stream:
    """One streamed answer, read on its own thread and cut by the caller at the deadline."""

    def __init__(self, answer: RemoteAnswer, on_delta, canceled, clock):
        self.answer, self.on_delta, self.canceled, self.clock = \
            answer, on_delta, canceled, clock
        self.lock, self.done, self.stopped = threading.Lock(), threading.Event(), False
        self.delivering = threading.Event()  # set: no feedback call in progress
        self.delivering.set()
        self.response = None

    def read(self, client: httpx.Client, url: str, body: dict) -> None:
        answer = self.answer
        try:
            with client.stream('POST', f'{url}/v1/chat/completions', json=body,
                               timeout=httpx.Timeout(10.0, read=None)) as response:
                with self.lock:
                    self.response = response
                    if self.stopped:  # killed before the replica answered: abort now
                        return
                answer.status = response.status_code
                if response.status_code != 200:
                    response.read()
                    answer.ended = 'failed'
                    answer.error = f'HTTP {response.status_code}: {response.text[:300]}'
                    return
                self._events(response)
        except (httpx.HTTPError, OSError, RuntimeError, ValueError) as exc:
            with self.lock:
                if not self.stopped:
                    answer.ended, answer.error = 'failed', f'{type(exc).__name__}: {exc}'
        finally:
            self.done.set()

    def _events(self, response) -> None:
        """Read SSE ``data:`` events (text, token times, finish reason, usage)."""
        answer = self.answer
        for line in response.iter_lines():
            if self.canceled():
                answer.ended = 'canceled'
                return
            if not line.startswith('data:'):
                continue
            data = line[5:].strip()
            if data == '[DONE]':
                return
            event = json.loads(data)
            if 'error' in event:
                answer.ended, answer.error = 'failed', str(event['error'])[:300]
                return
            with self.lock:
                if self.stopped:
                    return
                texts = self._take(event)
                self.delivering.clear()
            if not self._deliver(texts):  # the goal's rules stop it at this token
                with self.lock:
                    answer.ended, answer.finished = 'stopped', self.clock()
                self.done.set()  # the caller goes on; leaving the stream closes it here
                return
        with self.lock:  # no [DONE]: the replica went away mid-answer
            if not self.stopped:
                answer.ended = 'failed'
                answer.error = 'the stream ended before the answer did (replica gone?)'

    def _take(self, event: dict) -> list:
        """Add the event's tokens to the answer; return their texts, to send as feedback."""
        answer, texts = self.answer, []
        if event.get('usage'):
            answer.prompt_tokens = int(event['usage'].get('prompt_tokens', 0))
        for choice in event.get('choices', ()):
            text = (choice.get('delta') or {}).get('content') or ''
            if text:
                now = self.clock()
                if not answer.token_times:
                    answer.ttft_s = now - answer.started
                answer.token_times.append(now)
                answer.tokens += 1
                answer.text += text
                texts.append(text)
            if choice.get('finish_reason'):
                answer.finish_reason = choice['finish_reason']
        return texts

    def _deliver(self, texts: list) -> bool:
        """Send tokens already in the answer as feedback, outside the lock; False: stop.

        A feedback call that blocks (a congested transport) must not hold a Kill past the
        deadline; Kill waits for one in progress only a moment (DELIVERY_GRACE_S).
        """
        try:
            for text in texts:
                if self.on_delta(text) is False:
                    return False
            return True
        finally:
            self.delivering.set()

    def kill(self) -> RemoteAnswer:
        """Stop taking tokens, close the connection in the background, return the answer.

        The answer holds every token taken so far; the feedback of the last one may still
        be on its way when it takes longer than DELIVERY_GRACE_S.
        """
        with self.lock:
            self.stopped = True
        self.delivering.wait(DELIVERY_GRACE_S)
        with self.lock:
            response = self.response
            answer = replace(self.answer, ended='killed', finished=self.clock(),
                             token_times=list(self.answer.token_times))
        if response is not None:
            threading.Thread(target=response.close, daemon=True,
                             name='timebill-remote-abort').start()
        return answer


def deadline_priority(deadline_epoch_s: float) -> int:
    """Return vLLM's priority for a goal: its absolute deadline in Unix ms (int64).

    vLLM serves smaller priorities first (ties by arrival), so every node that shares a
    replica orders its goals by deadline (EDF) on the same wall clock.
    """
    return int(round(deadline_epoch_s * 1000.0))
