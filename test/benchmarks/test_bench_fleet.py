# SPDX-License-Identifier: Apache-2.0
"""bench_fleet's pure parts: the arrival schedule, a cell's figures, the table."""

from types import SimpleNamespace

from benchmarks.bench_fleet import cell, markdown, schedule


def test_arrivals_are_seeded_poisson_with_the_given_budgets():
    items = [SimpleNamespace(id=str(i)) for i in range(5)]
    arrivals = schedule(items, 400, 2.0, (3.0, 5.0), seed=1)
    assert arrivals == schedule(items, 400, 2.0, (3.0, 5.0), seed=1)
    times = [at for at, *_ in arrivals]
    assert times == sorted(times) and 170 < times[-1] < 230  # 400 goals at 2 per second
    assert {budget for *_, budget in arrivals} == {3.0, 5.0}


def record(outcome, met=False, e2e=1.0, budget=3.0, claimed=None):
    return {'outcome': outcome, 'met': met, 'claimed': met if claimed is None else claimed,
            'e2e_s': e2e, 'budget_s': budget}


def test_a_cell_counts_outcomes_losses_and_kill_lateness():
    figures = cell([record('COMPLETED', True), record('KILLED', e2e=3.01),
                    record('REJECTED', e2e=0.0), record('LOST', e2e=3.0),
                    record('COMPLETED', e2e=3.5, claimed=True)])
    assert (figures['met'], figures['refused'], figures['killed'], figures['lost']) == \
        (1, 1, 1, 1)
    assert figures['late_claimed'] == 1 and abs(figures['worst_kill_late_s'] - 0.01) < 1e-9


def test_the_table_compares_the_node_with_the_plain_client_of_its_cell():
    base = {'replicas': 1, 'load': 1.0, 'goals': 4, 'refused': 0, 'killed': 0,
            'failed': 0, 'lost': 0, 'late_claimed': 0, 'worst_kill_late_s': 0.0}
    report = {'command': 'c', 'commit': 'x', 'date': 'd', 'machine': 'm', 'vllm': 'v',
              'dtype': 'float32', 'replica_args': '', 'goals': 4, 'budgets': [3.0],
              'max_tokens': 8, 'capacity': {1: 1.0},
              'cells': [{**base, 'system': 'node', 'met': 3},
                        {**base, 'system': 'plain', 'met': 2},
                        {**base, 'load': 2.0, 'system': 'node', 'met': 1},
                        {**base, 'load': 2.0, 'system': 'plain', 'met': 0}]}
    text = markdown(report)
    assert '| 1 | 1 | node | 3/4 |' in text and '1.50x' in text
    assert '- (plain met 0)' in text
