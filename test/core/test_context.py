# SPDX-License-Identifier: Apache-2.0
"""Context reduction keeps the sentences BM25 ranks closest to the question, in order."""

import pytest

from timebill_ros.core.context import ContextCutTable, reduce_context, sentences

LOG = ('Forklift 3 returned to the charging row. Aisle 4 was swept clean.\n'
       'The bay code for dock 7 is 4412. The gate camera logged truck 9 leaving.\n'
       'Dock 2 reported a jammed shutter. Battery swap done on tug 5.')


def test_sentences_split_on_ends_and_lines():
    assert sentences(LOG)[:3] == ['Forklift 3 returned to the charging row.',
                                  'Aisle 4 was swept clean.', 'The bay code for dock 7 is 4412.']
    assert len(sentences(LOG)) == 6


def test_the_most_relevant_sentences_are_kept_in_their_order():
    reduced = reduce_context(LOG, 'What is the bay code for dock 7?', 0.35)
    assert reduced.text.startswith('The bay code for dock 7 is 4412.')
    assert reduced.kept < reduced.total == 6 and len(reduced.text) <= 0.35 * len(LOG) + 40
    kept = sentences(reduced.text)
    assert kept == [s for s in sentences(LOG) if s in kept]  # original order
    assert 'Dock 2 reported a jammed shutter.' in kept  # 'dock' is the next best match


def test_the_best_sentence_is_kept_even_over_the_share_and_all_of_it_at_one():
    reduced = reduce_context(LOG, 'bay code dock 7', 0.01)
    assert reduced.text == 'The bay code for dock 7 is 4412.' and reduced.kept == 1
    assert reduce_context(LOG, 'anything', 1.0).text == LOG
    with pytest.raises(ValueError):
        reduce_context(LOG, 'x', 0.0)


def test_the_fidelity_table_round_trips_and_a_missing_one_is_empty(tmp_path):
    table = ContextCutTable({0.5: 0.9, 0.25: 0.7}, 'measured', {0.5: 0.72})
    table.save(tmp_path / 't.json')
    again = ContextCutTable.load(tmp_path / 't.json')
    assert again.of(0.5) == 0.9 and again.of(0.125) is None and again.source == 'measured'
    assert again.likeness_of(0.5) == 0.72 and again.likeness_of(0.25) is None
    assert ContextCutTable.load(tmp_path / 'none.json').quality == {}
