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
