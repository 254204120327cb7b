# SPDX-License-Identifier: Apache-2.0
"""The answer metrics of the eviction benchmark on known cases."""

from benchmarks.bench_eviction import configurations, score, token_f1


def test_metrics():
    assert score('The Eiffel Tower.', ['eiffel tower']) == {'em': 1.0, 'f1': 1.0, 'contains': 1.0}
    assert score('Paris', ['London', 'Rome']) == {'em': 0.0, 'f1': 0.0, 'contains': 0.0}
    assert token_f1('in Paris France', 'Paris') == 0.5 and token_f1('yes indeed', 'yes') == 0.0
    assert configurations(['snapkv'], [0.0, 0.5]) == [('-', 0.0), ('snapkv', 0.5)]
