# SPDX-License-Identifier: Apache-2.0
"""The trace-driven evaluator replays fixed choices and the node's planner on traces."""

import pytest

from benchmarks import evaluate_planning as ev
from timebill_ros.evaluation import robot_workload

ITEMS = [item.id for item in robot_workload.load('test')[:2]]
# Profiles as the node stores them (float32 ~85 ms a step, llama.cpp ~8 ms).
PROFILES = {
    'SmolLM2-135M-Instruct-cpu-float32': {'coefficients': dict(a=0, b=0.003, c=0.2, p=0,
                                                               q=0.085)},
    'SmolLM2-135M-Instruct-cpu-int8-weight': {'coefficients': dict(a=0, b=0.003, c=0.2, p=0,
                                                                   q=0.06)},
    'SmolLM2-135M-Instruct-cpu-llama.cpp-q4_1': {'coefficients': dict(a=0, b=0.0016, c=0.01,
                                                                      p=0, q=0.008)},
}


def trace(item, strategy, prefill, step, tokens, text, predicted=0):
    return {'item': item, 'strategy': strategy, 'outcome': 'COMPLETED', 'tokens': tokens,
            'prefill_s': prefill, 'decode_s': step * (tokens - 1), 'queue_s': 0.0,
            'e2e_s': prefill + step * (tokens - 1), 'text': text, 'prompt_tokens': 40,
            'predicted': predicted}


def report():
    traces = []
    for item in ITEMS:
        traces += [trace(item, 'float32', 0.3, 0.085, 21, 'turn left at gate four'),
                   trace(item, 'int8-weight', 0.3, 0.06, 25, 'turn left at the gate'),
                   trace(item, 'llama.cpp-q4_1 + Kill', 0.07, 0.008, 21, 'turn left at gate'),
                   trace(item, 'llama.cpp-q4_1', 0.07, 0.008, 21, 'turn left at gate'),
                   {**trace(item, 'AUTO', 0.07, 0.008, 21, 'turn left at gate', 20),
                    'queue_s': 0.12}]
    strategies = ['float32', 'int8-weight', 'llama.cpp-q4_1 + Kill', 'AUTO']
    return {'traces': traces, 'profiles': PROFILES, 'tiers': ['0.3x', '1x', '20s'],
            'strategies': strategies, 'max_new_tokens': 64, 'items': 2, 'date': 'today',
            'command': 'bench', 'commit': 'abc', 'machine': 'here', 'records': [],
            'table': {tier: {s: {'met': 0, 'goals': 2} for s in strategies}
                      for tier in ['0.3x', '1x', '20s']}}


def test_fixed_choices_meet_a_budget_when_their_trace_ends_by_it():
    evaluation = ev.evaluate(report())
    here = evaluation['machines']['traced']['tiers']
    # float32 takes 2.0 s: met at 1x and 5 s, not at 0.3x (0.6 s); llama.cpp (0.23 s) always.
    assert [here[t]['float32']['met'] for t in ('0.3x', '1x', '20s')] == [0, 2, 2]
    assert all(here[t]['llama.cpp-q4_1 + Kill']['met'] == 2 for t in here)
    assert here['1x']['float32']['f1_met'] == pytest.approx(1.0)
    assert here['1x']['llama.cpp-q4_1 + Kill']['f1_met'] < 1.0


def test_auto_is_the_nodes_planner_choosing_among_the_options():
    evaluation = ev.evaluate(report())
    here = evaluation['machines']['traced']['tiers']
    assert here['0.3x']['AUTO']['choices'] == {'llama.cpp-q4_1': 2}  # only it fits
    assert here['20s']['AUTO']['choices'] == {'float32': 2}  # full fidelity fits
    assert here['0.3x']['AUTO']['met'] == 2
    # The node measured nothing met: every cell's gap is the predicted rate.
    assert evaluation['gap_points']['20s']['float32'] == pytest.approx(100.0)


def test_machine_profiles_scale_the_traces_and_drop_what_a_machine_cannot_run():
    evaluation = ev.evaluate(report())
    orin = evaluation['machines']['jetson-orin-nano']['tiers']
    assert orin['20s']['int8-weight']['met'] == 0  # no int8 CPU kernels there
    intel = evaluation['machines']['intel-xeon-2c']['tiers']
    assert intel['1x']['float32']['met'] == 2  # 1x is float32's own time there
    text = ev.markdown(report(), evaluation)
    assert '## jetson-orin-nano' in text and 'published' in text
    assert 'measured through the node: runs 21, 23, 24 and 25' in text


def slower(factor):
    """Return the test run as measured on a machine ``factor`` times slower throughout."""
    run = report()
    run['profiles'] = {stem: {'coefficients': {k: v * factor for k, v in
                                               profile['coefficients'].items()}}
                       for stem, profile in PROFILES.items()}
    for t in run['traces']:
        for key in ('prefill_s', 'decode_s', 'e2e_s'):
            t[key] *= factor
    return run


def test_a_machine_measured_through_the_node_scales_each_option_as_its_run_there_did(tmp_path):
    import json
    there = tmp_path / 'twice_as_slow'
    there.mkdir()
    (there / 'bench.json').write_text(json.dumps(slower(2.0)))
    here = ev.Replay(report())
    machine = ev.measured_machine('slow', ev.Replay(slower(2.0)), here, 'a test run')
    for option in ('float32', 'int8-weight', 'llama.cpp-q4_1'):
        assert machine.factor(option) == pytest.approx((2.0, 2.0))
    assert machine.factor('alpha 0.5') == machine.factor('float32')
    # A relative tier is relative to float32's time there: twice the budget, so every
    # fixed choice meets 1x as it does here; an absolute budget stays what it is.
    assert here.budget('1x', ITEMS[0], machine) == pytest.approx(2.0 * here.full_s[ITEMS[0]])
    assert here.budget('20s', ITEMS[0], machine) == 20.0
    evaluation = ev.evaluate(report(), measured={'slow': (str(there), 'a test run')})
    slow, traced = (evaluation['machines'][name]['tiers'] for name in ('slow', 'traced'))
    for strategy in ('float32', 'int8-weight', 'llama.cpp-q4_1 + Kill'):
        assert slow['1x'][strategy]['met'] == traced['1x'][strategy]['met']
    assert slow['20s']['float32']['met'] == 2  # 4.0 s of float32 still end by 20 s
    # Mixed factors: a hand-over prefills as its first option and decodes as its second.
    mixed = ev.Machine('m', '', {'llama.cpp-f16': (0.5, 3.0), 'llama.cpp-q4_1': (2.0, 1.5)})
    assert mixed.factor('llama.cpp-f16>llama.cpp-q4_1') == (0.5, 1.5)


def test_a_machine_measured_in_several_runs_averages_their_seconds(tmp_path):
    # One run there twice as slow, one four times: the profile is their mean, 3x.
    import json
    folders = []
    for factor in (2.0, 4.0):
        folder = tmp_path / f'slow_{factor:g}'
        folder.mkdir()
        (folder / 'bench.json').write_text(json.dumps(slower(factor)))
        folders.append(str(folder))
    here = ev.Replay(report())
    machine = ev.measured_machine('slow', [ev.Replay(slower(2.0)), ev.Replay(slower(4.0))],
                                  here, 'two test runs')
    assert machine.factor('llama.cpp-q4_1') == pytest.approx((3.0, 3.0))
    profiles = {m.name: m for m in ev.machines(here, {'slow': (folders, 'two test runs')})}
    assert profiles['slow'].factor('float32') == pytest.approx((3.0, 3.0))
    assert folders[1] in profiles['slow'].source


def test_reruns_jitter_turns_a_time_into_a_share_of_runs_that_meet():
    assert ev.met_share(1.0, 1.1, [0.9, 1.0, 1.2]) == pytest.approx(2 / 3)
    assert ev.met_share(1.0, 0.5, [0.9, 1.0, 1.2]) == 0.0
    assert ev.met_share(1.0, 1.0, []) == 1.0  # no reruns: the trace's own time


def test_auto_runs_a_goal_it_would_refuse_as_best_effort_as_the_idle_node_does():
    # 0.22 s: after 0.12 s of admission two answer tokens fit on llama.cpp, the answer
    # has 21: refused on P(fit), and run anyway (Kill) on the node, idle between goals.
    run = report()
    run['tiers'].append('0.11x')
    run['table']['0.11x'] = {s: {'met': 0, 'goals': 2} for s in run['strategies']}
    # Planned on the answers' spread: the text head is taken to cost 20 ms, over the
    # 11 ms the budget leaves it (predictor_share 0.05 of 0.22 s). Timed live, it was
    # 5-30 ms by this machine's load, and the test followed the load.
    # Refused below P(fit) 0.2 (Q4_1's answers are at times half as long as float32's:
    # by its measured spread a 2-token answer is just over the node's 2 % bar).
    bar = {'text_head_s': 0.02, 'admit_probability': 0.2}
    here = ev.evaluate(run, bar)['machines']['traced']['tiers']
    assert here['0.11x']['AUTO']['choices'] == {'llama.cpp-q4_1': 2}
    strict = ev.evaluate(run, {'idle_best_effort': False, **bar})
    assert strict['machines']['traced']['tiers']['0.11x']['AUTO']['choices'] == \
        {'refused': 2}
    assert strict['policy']['idle_best_effort'] is False


def test_main_writes_each_run_into_a_new_folder_and_never_overwrites(tmp_path):
    import json
    run = tmp_path / 'robot_2'
    run.mkdir()
    (run / 'bench.json').write_text(json.dumps(report()))
    out = tmp_path / 'strict'
    assert ev.main([str(run), '--out', str(out), '--no-idle-best-effort']) == 0
    written = json.loads((out / 'robot_2' / 'evaluation.json').read_text())
    assert written['policy']['idle_best_effort'] is False
    assert 'no-idle-best-effort' in (out / 'robot_2' / 'EVALUATION.md').read_text()
    assert not (run / 'evaluation.json').exists()  # the run's own folder is untouched
    with pytest.raises(SystemExit, match='never overwritten'):
        ev.main([str(run), '--out', str(out)])


def test_a_tier_run_prefills_only_what_its_cache_lacks():
    def prefill(n):
        return 0.001 * n + 0.1
    cold = {'prompt_tokens': 1000, 'prefill_s': 2.0, 'note': ''}
    # The torch prefix cache keeps all whole 32-token blocks but the last token's: 992.
    assert ev.cached_now('', 1000, 'tier') == 992
    assert ev.warm_prefill(cold, prefill, 992) == pytest.approx(2.0 * 0.008 / 1.0)
    # A trace that already found its prompt cached is not made faster again.
    warm = {**cold, 'prefill_s': 0.05, 'note': '992 of 1000 prompt tokens in the prefix cache'}
    assert ev.cached_then(warm) == 992
    assert ev.warm_prefill(warm, prefill, 992) == pytest.approx(0.05)
    # A llama.cpp option holds every prompt longer than a chunk (64 tokens) and takes
    # the whole chunks of all but the last token; a short command is held by none.
    assert ev.cached_now('llama.cpp-q4_1', 1000, 'item') == 960
    assert ev.cached_now('llama.cpp-q4_1', 1000, 'tier') == 960
    assert ev.cached_now('llama.cpp-q4_1', 60, 'item') == 0
    held = {**cold, 'note': '999 of 1000 prompt tokens held by llama.cpp-q4_1 from its last'}
    assert ev.cached_then(held) == 999


def test_auto_plans_with_the_cache_a_long_prompt_finds():
    # A long context, cold in its traces: 3.2 s of torch prefill. A tier run finds the
    # prompt cached (~0.2 s left to prefill), and AUTO's planner is told so.
    data = report()
    for t in data['traces']:
        t['prompt_tokens'] = 1000
        if not t['strategy'].startswith('llama'):
            t['prefill_s'] = 3.2
            t['e2e_s'] = 3.2 + t['decode_s']
    evaluation = ev.evaluate(data)
    here = evaluation['machines']['traced']['tiers']
    # float32 at 1x of its (cold) loose time meets: warm, its prefill is ~0.2 s.
    assert here['1x']['float32']['met'] == 2
    # Planned cold (3.4 s of prefill in a 4.8 s budget) only llama.cpp would fit.
    assert set(here['1x']['AUTO']['choices']) <= {'float32', 'int8-weight'}
    assert here['1x']['AUTO']['met'] == 2


def test_auto_plans_with_the_time_errors_the_nodes_etes_would_measure():
    rep = report()
    # float32 ran its two goals 1.0x and 1.3x its drift; three reruns of one of them.
    rep['traces'][0]['decode_s'] *= 1.3
    rep['records'] = [{'item': ITEMS[0], 'strategy': 'float32', 'outcome': 'COMPLETED',
                       'tokens': 21, 'e2e_s': (0.3 + 0.085 * 20) * ratio}
                      for ratio in (0.9, 1.0, 1.1)]
    replay = ev.Replay(rep)
    points = replay.errors['float32']
    assert len(points) == 5 and list(points) == sorted(points)
    assert points[0] < 1.0 < points[-1] and points[-1] > 1.2
    # No spread of its own around its drift: the reruns' spread alone.
    assert replay.errors['llama.cpp-q4_1'][2] == pytest.approx(replay.jitter[1])
    # At 1x with errors counted, the float32 plan no longer counts as sure.
    # (The recorded lengths only: the text head would predict its own.)
    counted = ev.evaluate(rep, {'text_head': False})['machines']['traced']['tiers']['1x'][
        'AUTO']
    ignored = ev.evaluate(rep, {'count_time_errors': False, 'text_head': False})
    assert ignored['machines']['traced']['tiers']['1x']['AUTO']['choices'] == \
        {'float32': 2}
    assert counted['choices'].get('llama.cpp-q4_1', 0) >= 1


def test_a_skipped_predictor_is_replayed_with_the_text_head_the_node_now_has():
    replay = ev.Replay(report())
    replay.predict_text()
    assert set(replay.text) == set(ITEMS)
    for predicted, seconds, dist in replay.text.values():
        assert 1 <= predicted and 0.0 < seconds < 1.0
        assert dist is None or dist.source.startswith('rlp-text')
    assert ev.evaluate(report())['policy']['text_head'] is True
    assert ev.evaluate(report(), {'text_head': False})['policy']['text_head'] is False


def test_a_planner_parameter_is_replayed_as_set_and_checked_like_the_nodes(tmp_path):
    import json
    assert ev.planner_overrides(['fit_tolerance=0', 'length_hedge=0.5']) == {
        'fit_tolerance': 0.0, 'length_hedge': 0.5}
    with pytest.raises(SystemExit, match='not a planner setting'):
        ev.planner_overrides(['max_batch=4'])
    with pytest.raises(SystemExit, match='fit_tolerance'):
        ev.planner_overrides(['fit_tolerance=2'])  # outside 0 .. 1
    run = tmp_path / 'robot_2'
    run.mkdir()
    (run / 'bench.json').write_text(json.dumps(report()))
    assert ev.main([str(run), '--out', str(tmp_path / 'out'), '--set', 'fit_tolerance=0']) == 0
    written = json.loads((tmp_path / 'out' / 'robot_2' / 'evaluation.json').read_text())
    assert written['policy']['fit_tolerance'] == 0.0


def test_main_pools_two_runs_into_one_table(tmp_path):
    import json
    folders = []
    for name in ('robot_a', 'robot_b'):
        folder = tmp_path / name
        folder.mkdir()
        (folder / 'bench.json').write_text(json.dumps(report()))
        folders.append(str(folder))
    assert ev.main(folders + ['--out', str(tmp_path / 'out')]) == 0
    cells = json.loads((tmp_path / 'out' / 'pooled.json').read_text())
    assert cells['20s']['AUTO']['goals'] == 4  # two items in each run
    assert cells['20s']['float32']['expected'] == pytest.approx(4.0)  # every trace fits 20 s
    assert cells['20s']['float32']['gap_points'] == pytest.approx(100.0)  # the node: 0 met
    assert '| 20s | 4 |' in (tmp_path / 'out' / 'POOLED.md').read_text()


def test_a_run_is_replayed_on_a_profile_against_a_run_of_its_items_on_that_machine(tmp_path):
    import json
    # The node there met its one goal with every choice but float32 and int8-weight at
    # 0.3x (0.6 s: their answers take 2.0 and 1.74 s), as the replay here does.
    target = report()
    target['traces'] = [t for t in target['traces'] if t['item'] == ITEMS[0]]
    slow = {('0.3x', 'float32'), ('0.3x', 'int8-weight')}
    target['table'] = {tier: {s: {'met': int((tier, s) not in slow), 'goals': 1}
                              for s in target['strategies']} for tier in target['tiers']}
    check = ev.cross_check(report(), target, 'traced', {'text_head_s': 0.02})
    assert check['tiers']['0.3x']['float32']['goals'] == 1  # only the target's item
    assert check['gap_points']['0.3x']['float32'] == pytest.approx(0.0)
    assert check['gap_points']['0.3x']['llama.cpp-q4_1 + Kill'] == pytest.approx(0.0)
    assert check['within_2_sd'] == (12, 12)
    runs = tmp_path / 'robot_2'
    there = tmp_path / 'there'
    for folder, data in ((runs, report()), (there, target)):
        folder.mkdir()
        (folder / 'bench.json').write_text(json.dumps(data))
    out = tmp_path / 'out'
    assert ev.main([str(runs), '--against', str(there), '--profile', 'traced',
                    '--out', str(out)]) == 0
    assert '| 0.3x | 0 / 0.0 (+0.0)' in (out / 'CROSS_CHECK.md').read_text()
    target['traces'][0]['item'] = 'an item the runs lack'
    with pytest.raises(SystemExit, match='lack'):
        ev.cross_check(report(), target, 'traced', {})


def test_auto_can_be_replayed_with_another_cut_effects_table(tmp_path):
    # A table saying Q4_1's answers run 50 times float32's: at 0.3x, where only Q4_1
    # fits a 21-token answer, it is then unlikely to fit and AUTO refuses goals.
    from timebill_ros.core.cuts import CutEffect, CutEffects, SHIPPED
    shipped = CutEffects.load(SHIPPED)
    table = tmp_path / 'effects.json'
    CutEffects(shipped.eviction_ratios, shipped.eviction,
               {**shipped.precision, 'llama.cpp-q4_1': CutEffect(50.0, 0.7)},
               source='a test table').save(table)
    strict = {'idle_best_effort': False}
    default = ev.evaluate(report(), strict)['machines']['traced']['tiers']
    assert default['0.3x']['AUTO']['choices'] == {'llama.cpp-q4_1': 2}
    other = ev.evaluate(report(), {**strict, 'effects': str(table)})
    assert other['machines']['traced']['tiers']['0.3x']['AUTO']['choices'].get('refused', 0) >= 1
    assert other['policy']['effects'] == str(table)


def test_auto_can_be_replayed_with_another_length_head(tmp_path):
    """A head given to the replay predicts every item again on the embedded model's states."""
    import numpy as np
    from timebill_ros.runtime.length_heads import LinearHead, train_head
    from timebill_ros.runtime.predictor import SHIPPED_HEAD
    shipped = LinearHead.load(SHIPPED_HEAD)
    rng = np.random.default_rng(0)
    # A head that has only seen answers at its cap: it plans every goal for the cap.
    long = train_head(rng.normal(size=(8, len(shipped.mean))), np.full(8, 128), 16, 128)
    long.features, long.target, long.decode = shipped.features, shipped.target, 'median'
    long.distribution = shipped.distribution
    path = tmp_path / 'long.npz'
    long.save(path)
    assert ev.Replay(report()).predict_target(str(path)) == {item: 64 for item in ITEMS}
    replayed = ev.evaluate(report(), {'text_head': False, 'length_head': str(path)})
    assert replayed['policy']['length_predictor'] == f'rlp ({path})'
    assert ev.evaluate(report())['policy']['length_predictor'] == 'rlp (recorded)'


def test_a_replay_with_an_oracle_length_predictor_predicts_float32s_answer_lengths():
    oracle = ev.evaluate(report(), {'text_head': False, 'length_head': 'oracle'})
    assert oracle['policy']['length_predictor'] == 'oracle (float32 answer lengths)'
    # Every goal planned for its true 21 tokens: AUTO meets every tier it can.
    tiers = oracle['machines']['traced']['tiers']
    assert tiers['20s']['AUTO']['met'] == 2 and tiers['0.3x']['AUTO']['met'] == 2
