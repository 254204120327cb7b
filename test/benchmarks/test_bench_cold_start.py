# SPDX-License-Identifier: Apache-2.0
"""bench_cold_start: the shipped parameters with profiles in the fresh cache; its report."""

from benchmarks.bench_cold_start import markdown, node_params


def test_the_node_keeps_its_profiles_in_the_fresh_cache():
    params = node_params('/tmp/fresh')
    assert params['profile'] == '/tmp/fresh/profiles/embedded.yaml'
    assert params['calibrate_on_start'] is True and params['llama_engines']


def test_the_report_gives_each_time_and_every_goal():
    report = {'date': '2026-12-07', 'command': 'python -m benchmarks.bench_cold_start',
              'commit': 'abc', 'machine': 'vm', 'second_ready_s': 9.5,
              'first': {'ready_s': 41.0, 'first_answer_s': 41.8, 'all_profiled_s': None,
                        'lines': ['[INFO] profiled llama.cpp-q4_1 in 12.0 s'],
                        'goals': [{'sent_s': 41.2, 'accepted': True, 'reason': '',
                                   'outcome': 0, 'met': True, 'e2e_s': 0.4,
                                   'option': 'llama.cpp-f16', 'note': 'not yet profiled'},
                                  {'sent_s': 52.0, 'accepted': False,
                                   'reason': 'cannot meet'}]}}
    text = markdown(report)
    assert '| ready (action server up) | 41.0 |' in text
    assert '| first answer | 41.8 |' in text and 'not within the limit' in text
    assert '| second start, ready | 9.5 |' in text
    assert '| COMPLETED | True | 0.40 | llama.cpp-f16 |' in text
    assert 'refused: cannot meet' in text
    assert 'profiled llama.cpp-q4_1 in 12.0 s' in text
