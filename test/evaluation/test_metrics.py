# SPDX-License-Identifier: Apache-2.0
import pytest

from timebill_ros.evaluation.metrics import rouge_l, score


def test_f1_and_exact_match_on_known_cases():
    assert score('f1', 'The Eiffel Tower.', ['Eiffel Tower']) == 1.0  # SQuAD normalisation
    assert score('f1', 'tower in Paris', ['Eiffel Tower']) == pytest.approx(0.4)
    assert score('em', 'an Eiffel tower', ['Eiffel Tower', 'x']) == 1.0
    assert score('f1', 'nothing alike', ['Eiffel Tower']) == 0.0


def test_rouge_l_matches_the_longest_common_subsequence():
    # LCS "the cat on the mat" = 5 of 6 tokens each way: P = R = F = 5/6.
    assert rouge_l('the cat sat on the mat', 'the cat was on the mat') == pytest.approx(5 / 6)
    assert score('rougeL', 'x y', ['a b', 'x y']) == 1.0


def test_unknown_metric_and_no_reference_raise():
    with pytest.raises(ValueError, match='unknown metric'):
        score('bleu', 'a', ['a'])
    with pytest.raises(ValueError, match='no reference'):
        score('f1', 'a', [])


def test_contains_matches_the_code_inside_an_answer():
    from timebill_ros.evaluation.metrics import contains, score
    assert contains('The spare is kept in bay C-27.', 'C-27') == 1.0
    assert contains('C27', 'C-27') == 1.0  # punctuation is normalised away
    assert contains('Bay C-72', 'C-27') == 0.0 and contains('anything', '') == 0.0
    assert score('contains', 'bay D-22', ['D-22']) == 1.0


def test_needle_items_plant_one_fact_and_ask_for_it():
    from timebill_ros.evaluation import tasks
    first = list(tasks._needle_items(0, count=3))
    assert first == list(tasks._needle_items(0, count=3))  # deterministic
    for item_id, instruction, context, refs in first:
        assert context.count('[note] maintenance') == 1 and f'bay {refs[0]}.' in context
        assert 'Answer with the bay code only' in instruction
    assert len({refs[0] for *_, refs in first}) > 1


def test_status_items_hide_one_fault_and_name_its_unit_as_the_answer():
    from timebill_ros.evaluation import tasks
    first = list(tasks._status_items(0, count=4))
    assert first == list(tasks._status_items(0, count=4))  # deterministic
    for item_id, instruction, context, refs in first:
        alarms = [line for line in context.splitlines() if line.startswith('[alarm]')]
        assert len(alarms) == 1 and alarms[0].startswith(f'[alarm] {refs[0]}: ')
        assert instruction == tasks.STATUS_INSTRUCTION and item_id.startswith('status-0-')
    assert score('contains', 'Unit FORK-5 stopped with a motor fault.', ['FORK-5']) == 1.0


def test_route_items_ask_a_street_the_description_names():
    from timebill_ros.evaluation import tasks
    first = list(tasks._route_items(0, count=6))
    assert first == list(tasks._route_items(0, count=6))  # deterministic
    for item_id, instruction, context, refs in first:
        lines = context.splitlines()
        assert item_id.startswith('route-0-') and 40 <= len(lines) - 2 <= 150
        assert 'street name only' in instruction and refs[0] in context
        if instruction.startswith('On which street does the route end'):
            assert refs[0] in lines[-2]  # the last segment, before the arrival line


def test_held_out_context_items_take_kinds_in_turn():
    from transformers import AutoTokenizer
    from benchmarks.bench_context import held_out_items
    from timebill_ros.runtime.model import embedded_dir
    tokenizer = AutoTokenizer.from_pretrained(embedded_dir())
    items = held_out_items(5, tokenizer, 7, ('needle', 'squad', 'status'))
    assert [item.task for item in items] == ['needle', 'squad', 'status', 'needle', 'squad']
    assert all(500 <= item.prompt_tokens <= 4000 for item in items)
    # By default needles and SQuAD alternate, needles first (the earlier runs' items).
    assert [i.task for i in held_out_items(3, tokenizer, 7)] == ['needle', 'squad', 'needle']
