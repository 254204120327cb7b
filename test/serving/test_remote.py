# SPDX-License-Identifier: Apache-2.0
"""The vLLM replica client: request bodies, the online timing model, routing (pure parts).

The streaming itself runs against a real `vllm serve` in test/ros/test_node_vllm.py and
benchmarks/bench_vllm.py (results/vllm); the Kill's bound is also checked here against a
plain HTTP server that streams slowly.
"""

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import json
import threading
import time

import httpx
import pytest

from timebill_ros.serving.remote import (
    deadline_priority, joined, RemoteAnswer, RemoteGoal, stream_goal)
from timebill_ros.serving.replica_pool import Load, ReplicaPool, ReplicaTiming


def test_the_body_carries_the_cap_the_priority_and_the_answer_form():
    schema = '{"type": "object", "properties": {"lane": {"enum": ["left", "right"]}}}'
    goal = RemoteGoal(messages=({'role': 'user', 'content': 'Go left.'},), max_tokens=32,
                      stop=('\n\n',), seed=7, top_p=0.9, temperature=0.5, json_schema=schema)
    body = goal.body('smollm2', deadline_priority(1796284800.25))
    assert body['stream'] and body['max_tokens'] == 32 and body['priority'] == 1796284800250
    assert body['structured_outputs'] == {'json': json.loads(schema)}
    assert body['stop'] == ['\n\n'] and body['seed'] == 7 and body['top_p'] == 0.9
    plain = RemoteGoal(messages=(), max_tokens=4).body('m', 1)
    assert 'structured_outputs' not in plain and 'seed' not in plain and 'stop' not in plain
    assert RemoteGoal(messages=(), max_tokens=4, grammar='root ::= "yes"').body(
        'm', 1)['structured_outputs'] == {'grammar': 'root ::= "yes"'}
    # Earlier deadlines are served first (vLLM: smaller priority first).
    assert deadline_priority(100.0) < deadline_priority(100.001)


def answer(ttft, gaps):
    times, t = [ttft], ttft
    for gap in gaps:
        t += gap
        times.append(t)
    return RemoteAnswer(ttft_s=ttft, token_times=times, tokens=len(times))


def test_the_timing_model_fits_ttft_and_inter_token_latency_from_streams():
    """First tokens wait for the prefill ahead by deadline; every goal beside slows steps."""
    timing = ReplicaTiming()
    for prompt, running, ahead_tokens in ((100, 0, 0), (400, 0, 0), (100, 2, 500),
                                          (400, 3, 2000), (250, 1, 100), (250, 4, 0)):
        ttft = 0.05 + 0.001 * prompt + 0.002 * ahead_tokens
        timing.observe(prompt, Load(running, 1, ahead_tokens),
                       answer(ttft, [0.04 + 0.01 * running] * 5))
    assert abs(timing.ttft_s(300, Load(0, 0, 50)) - (0.05 + 0.3 + 0.1)) < 1e-6
    assert abs(timing.itl_s(3) - 0.07) < 1e-6
    assert abs(timing.finish_s(300, 11, Load(1, 1, 50)) - (0.45 + 10 * 0.05)) < 1e-6
    assert timing.tokens_within(300, Load(1, 1, 50), 0.951) == 11


def test_after_a_burst_a_lone_goal_is_never_timed_faster_than_any_stream_seen():
    """A fit on a burst's streams alone says ~0 s a step idle; the fastest seen bounds it."""
    now = [0.0]
    timing = ReplicaTiming(clock=lambda: now[0])
    for _ in range(3):  # alone, a minute ago
        timing.observe(30, Load(0, 0, 0), answer(0.05, [0.04] * 5))
    now[0] = 60.0
    for running in range(6, 12):  # the burst: every step shared by 6-11 goals
        timing.observe(30, Load(running, 1, 30 * running),
                       answer(0.005 * running + 0.001 * 30 * running, [0.01 * running] * 5))
    assert timing.itl_coef[0] + timing.itl_coef[1] * 0 < 0.02  # the fit alone: too fast
    assert timing.itl_s(0) >= 0.04 and timing.ttft_s(30) >= 0.05
    assert timing.finish_s(30, 25) >= 0.05 + 24 * 0.04
    assert abs(timing.itl_s(10) - 0.10) < 1e-3  # under load the fit still speaks


def test_a_goal_waits_only_for_the_prefill_ahead_of_it_by_deadline():
    pool = ReplicaPool(['http://a:8000'], clock=lambda: 0.0)
    replica = pool.replicas[0]
    late = pool.started(replica, deadline=9.0, prompt_tokens=2000)
    early = pool.started(replica, deadline=2.0, prompt_tokens=30)
    assert late.load == Load(0, 0, 0) and early.load == Load(1, 0, 0)
    assert replica.load(5.0) == Load(2, 1, 30) and replica.load(10.0) == Load(2, 2, 2030)
    pool.token(late)  # its first token: its prefill no longer holds up those behind
    assert replica.load(10.0) == Load(2, 2, 30)
    pool.ended(replica, RemoteAnswer(), late)
    assert replica.inflight == [early] and replica.running == 1


def test_the_pool_routes_to_the_earliest_finish_and_leaves_failed_replicas_out():
    now = [0.0]
    pool = ReplicaPool(['http://a:8000/', 'http://b:8000'], clock=lambda: now[0])
    slow, fast = pool.replicas
    fast.timing.itl_coef[0] = 0.01
    route = pool.earliest(prompt_tokens=50, tokens=10)
    assert route.replica is fast and route.seconds < 0.5 and slow.url == 'http://a:8000'
    assert route.load == Load() and route.timing is fast.timing  # nothing runs there yet
    goal = pool.started(fast, 3.0, 50)
    pool.ended(fast, RemoteAnswer(ended='failed', error='connection refused'), goal)
    assert fast.running == 0 and fast.last_error == 'connection refused'
    assert pool.earliest(50, 10).replica is slow  # down for a while
    now[0] = 11.0
    assert pool.earliest(50, 10).replica is fast
    pool.mark_down(slow, 'gone')
    pool.mark_down(fast, 'gone too')
    assert pool.earliest(50, 10).replica is None


def test_a_moved_goal_asks_the_next_replica_to_continue_its_answer():
    goal = RemoteGoal(messages=({'role': 'user', 'content': 'Go.'},), max_tokens=8,
                      prefix='Turning left')
    body = goal.body('m', 1)
    assert body['messages'][-1] == {'role': 'assistant', 'content': 'Turning left'}
    assert body['continue_final_message'] and not body['add_generation_prompt']
    first = RemoteAnswer(text='Turning', tokens=1, ttft_s=0.3, token_times=[10.3],
                         started=10.0, ended='failed')
    rest = RemoteAnswer(text=' left', tokens=1, ttft_s=0.2, token_times=[11.2],
                        started=11.0, finished=11.3)
    both = joined(first, rest)
    assert both.text == 'Turning left' and both.tokens == 2 and both.ended == 'completed'
    assert both.started == 10.0 and both.ttft_s == 0.3 and both.itl_s() == [11.2 - 10.3]


class _SlowSse(BaseHTTPRequestHandler):
    """A real HTTP server streaming one token every 0.1 s as vLLM's SSE chunks."""

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers['Content-Length']))
        self.send_response(200)
        self.send_header('Content-Type', 'text/event-stream')
        self.end_headers()
        try:
            for index in range(100):
                chunk = {'choices': [{'delta': {'content': f' w{index}'}}]}
                self.wfile.write(f'data: {json.dumps(chunk)}\n\n'.encode())
                self.wfile.flush()
                time.sleep(0.1)
        except OSError:  # the client closed the stream: how a Kill aborts a request
            pass

    def log_message(self, *args):
        pass


def test_kill_ends_at_the_deadline_while_a_feedback_call_blocks():
    server = ThreadingHTTPServer(('127.0.0.1', 0), _SlowSse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sent, blocked = [], threading.Event()

    def on_delta(text):  # the third token's feedback blocks for 3 s (a congested transport)
        sent.append(text)
        if len(sent) == 3:
            blocked.set()
            time.sleep(3.0)
    try:
        with httpx.Client() as client:
            start = time.monotonic()
            answer = stream_goal(client, f'http://127.0.0.1:{server.server_port}', {},
                                 start + 1.0, on_delta)
            returned = time.monotonic()
    finally:
        server.shutdown()
    assert blocked.is_set() and answer.ended == 'killed'
    assert returned - start < 1.0 + 0.2, returned - start
    assert answer.finished - start < 1.0 + 0.2
    # The result holds the tokens whose feedback was sent, the blocked one included.
    assert answer.tokens == 3 and answer.text == ''.join(sent)


def test_first_tokens_slowed_by_the_goals_beside_are_not_read_as_the_idle_speed():
    """A replica measured under load is predicted fast again once it is idle."""
    timing = ReplicaTiming()
    for prompt, running in ((100, 0), (300, 0), (100, 6), (300, 7), (200, 3), (200, 8)):
        timing.observe(prompt, Load(running, 0, 0),
                       answer(0.1 + 0.001 * prompt + 0.4 * running, [0.05] * 5))
    assert abs(timing.ttft_s(200) - 0.3) < 1e-6  # idle: no share of the loaded waits
    assert abs(timing.ttft_s(200, Load(5, 0, 0)) - 2.3) < 1e-6
    # So an idle replica wins the goal over a busy one with the same hardware.
    pool = ReplicaPool(['http://a:1', 'http://b:1'], clock=lambda: 0.0)
    pool.replicas[0].timing, pool.replicas[1].timing = timing, ReplicaTiming()
    pool.replicas[1].timing._ttft, pool.replicas[1].timing._itl = timing._ttft, timing._itl
    pool.replicas[1].timing._refit()
    for _ in range(4):
        pool.started(pool.replicas[0])
    assert pool.earliest(200, 10).replica is pool.replicas[1]


def test_newer_streams_outweigh_older_ones_in_a_replicas_fit():
    """A replica measured slow a minute ago and fast since is predicted fast."""
    now = [0.0]
    timing = ReplicaTiming(clock=lambda: now[0])
    for gap in (0.18, 0.17, 0.19, 0.18):  # slow while the machine was busy
        timing.observe(50, Load(), answer(0.3, [gap] * 8))
        now[0] += 1.0
    now[0] += 60.0
    for gap in (0.08, 0.09):  # fast again
        timing.observe(50, Load(), answer(0.3, [gap] * 8))
        now[0] += 1.0
    assert timing.itl_s(0) < 0.1
    assert timing.last_sample == 65.0  # the newest stream


def test_an_idle_replica_not_heard_from_is_timed_as_its_peer_and_gets_a_goal():
    now = [0.0]
    pool = ReplicaPool(['http://a:1', 'http://b:1'], clock=lambda: now[0])
    busy, idle = pool.replicas
    for _ in range(3):  # b was measured slow early on, a fast
        idle.timing.observe(50, Load(), answer(0.3, [0.2] * 8))
    now[0] = 30.0
    for running in (0, 1, 2, 3):
        busy.timing.observe(50, Load(running), answer(0.3, [0.05 + 0.02 * running] * 8))
    for _ in range(3):
        pool.started(busy, 40.0, 50)
    route = pool.earliest(50, 20, 40.0)
    # b's own figures (0.2 s a token) would lose to a with three running (0.11 s).
    assert idle.timing.finish_s(50, 20) > busy.timing.finish_s(50, 20, busy.load(40.0))
    assert route.replica is idle and route.timing is busy.timing
    assert 'no stream for 30.0 s: timed as http://a:1' == route.stand_in
    # Once a goal runs there, or it has streamed lately, its own figures count again.
    goal = pool.started(idle, 40.0, 50)
    assert pool.earliest(50, 20, 40.0).stand_in == ''
    pool.ended(idle, answer(0.3, [0.2] * 8), goal)
    assert pool.earliest(50, 20, 40.0).stand_in == '' and idle.timing.last_sample == 30.0


def test_the_gaps_streaming_now_time_the_next_goals_steps():
    """A fit read slow under an overload is scaled to what the replica streams now."""
    now = [100.0]
    pool = ReplicaPool(['http://a:1'], clock=lambda: now[0])
    replica = pool.replicas[0]
    replica.timing.itl_coef[:] = (0.4, 0.0)  # fitted while overloaded
    replica.timing.last_sample = 99.0
    goal = pool.started(replica, 110.0, 50)
    for _ in range(6):  # it streams a token every 60 ms
        pool.token(goal)
        now[0] += 0.06
    route = pool.earliest(50, 11, 110.0)
    assert route.timing.itl_s(1) == pytest.approx(0.06)
    assert route.seconds == pytest.approx(route.timing.ttft_s(50, route.load) + 10 * 0.06)
    assert 'gaps streaming now (60 ms)' in route.stand_in and goal.prefilled
    now[0] += 3.0  # those gaps are old now: the fit again
    assert pool.earliest(50, 11, 110.0).timing is replica.timing


class _TooLong(BaseHTTPRequestHandler):
    """A real HTTP server answering as vLLM does a prompt past its context: HTTP 400."""

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers['Content-Length']))
        body = json.dumps({'error': {'message': "This model's maximum context length is "
                                                '4096 tokens.'}}).encode()
        self.send_response(400)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_replica_refusing_a_goal_is_not_marked_down():
    server = ThreadingHTTPServer(('127.0.0.1', 0), _TooLong)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f'http://127.0.0.1:{server.server_address[1]}'
    try:
        with httpx.Client() as client:
            answer = stream_goal(client, url, {}, time.monotonic() + 5.0)
    finally:
        server.shutdown()
    assert answer.ended == 'failed' and answer.status == 400 and answer.refused_goal
    assert 'maximum context length' in answer.error
    pool = ReplicaPool([url])
    pool.ended(pool.replicas[0], answer, pool.started(pool.replicas[0], 5.0, 5000))
    assert pool.earliest(50, 10).replica is pool.replicas[0]  # still up
    assert not RemoteAnswer(ended='failed', status=503).refused_goal
