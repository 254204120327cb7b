# SPDX-License-Identifier: Apache-2.0
"""The long-context benchmark's items, tables and lateness figures (no node needed)."""

from benchmarks import bench_context as bench


def record(tier, strategy, met, late, correct=False, outcome='COMPLETED', claimed=None):
    return {'tier': tier, 'strategy': strategy, 'met': met, 'late': late, 'correct': correct,
            'outcome': outcome, 'claimed': met if claimed is None else claimed}


def test_the_repeated_context_plants_ten_distinct_facts_it_asks_about():
    context, facts = bench.repeated_context()
    assert len(facts) == 10 and len({question for question, _ in facts}) == 10
    assert all(f'storage bay {bay}.' in context for _, bay in facts)
    assert bench.repeated_context() == (context, facts)  # deterministic


def test_the_summary_counts_met_correct_refused_and_lateness():
    loose = {'a': {'correct': True}, 'b': {'correct': False}}
    records = [record(0.6, 'NONE', False, 0.12, outcome='KILLED'),
               record(0.6, 'NONE', True, -0.5, correct=True),
               record(0.6, 'AUTO', False, None, outcome='REFUSED'),
               record(0.6, 'AUTO', False, 0.04, outcome='KILLED'),
               record(0.6, 'alpha 0.5', False, 0.3, outcome='COMPLETED', claimed=True)]
    table = bench.summary(loose, records, [0.6])['0.6']
    assert table['NONE'] == {'goals': 2, 'met': 1, 'met_correct': 1, 'right_full': 1,
                             'refused': 0, 'late_max': 0.12, 'late_p99': 0.12,
                             'late_claimed': 0, 'reduced': 0}
    assert table['AUTO']['refused'] == 1 and table['AUTO']['late_max'] == 0.04
    assert table['alpha 0.5']['late_claimed'] == 1  # a late answer claimed on time: counted
    assert bench.p99(list(range(1, 101))) == 99


def test_tiers_run_item_by_item_and_save_whole_items():
    from types import SimpleNamespace
    items = [SimpleNamespace(item_id=name, metric='contains', references=['P-27'])
             for name in ('a', 'b')]
    asked, saved = [], []

    class Nodes:
        def ask(self, node, item, budget_s, **goal):
            asked.append((item.item_id, round(budget_s, 3)))
            # AUTO's context reduced
            tokens = 900 if goal.get('mode') == int(bench.Mode.AUTO) else 1000
            return {'e2e_s': 10.0, 'prefill_s': 8.0, 'text': 'bay P-27', 'met': True,
                    'prompt_tokens': tokens, 'late': -1.0, 'outcome': 'COMPLETED',
                    'claimed': True}

    loose, records = bench.run_tiers(
        Nodes(), items, [0.6, 0.8], lambda *a: None,
        lambda loose, records: saved.append((len(loose), len(records))))
    per_item = 1 + 2 * len(bench.STRATEGIES)
    assert [name for name, _ in asked] == ['a'] * per_item + ['b'] * per_item
    assert asked[1][1] == 6.0 and asked[-1][1] == 8.0  # tier x the item's own loose time
    assert saved == [(1, per_item - 1), (2, 2 * (per_item - 1))]
    assert all(r['correct'] for r in records) and loose['a']['correct']
    assert [r['reduced'] for r in records[:3]] == [False, False, True]
    assert bench.summary(loose, records, [0.6])['0.6']['AUTO']['reduced'] == 2


def test_a_run_stopped_early_is_reported_from_its_whole_items(tmp_path):
    import json
    loose = {'a': {'correct': True, 'sent': 10.0}, 'b': {'correct': False, 'sent': 70.0}}
    records = [dict(record(0.6, name, True, -1.0, correct=True), item='a', sent=20.0)
               for name in bench.STRATEGIES]
    records += [dict(record(0.6, name, False, 0.05, outcome='KILLED'), item='b', sent=130.0)
                for name in bench.STRATEGIES]
    (tmp_path / 'partial.json').write_text(json.dumps({
        'command': 'python -m benchmarks.bench_context --items 60', 'commit': 'abc',
        'date': '2026-12-04', 'machine': 'vm', 'items': 60, 'tiers': [0.6],
        'loose': loose, 'records': records}))
    assert bench.main(['--out', str(tmp_path), '--report-partial']) == 0
    report = json.loads((tmp_path / 'bench.json').read_text())
    assert report['items'] == 2 and report['stopped_early'] == 'stopped after 2 of 60 items'
    assert report['table']['0.6']['AUTO']['met'] == 1 and report['minutes'] == 2.0
    assert 'stopped after 2 of 60 items' in (tmp_path / 'README.md').read_text()
    assert not (tmp_path / 'partial.json').exists()
