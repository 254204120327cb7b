# SPDX-License-Identifier: Apache-2.0
"""measure_context_cut's summary: right answers kept per share, against the whole context."""

from training import measure_context_cut as mcc


def row(item, whole, half, quarter, texts=('the dock', 'the dock', 'a dock')):
    def cell(right, tokens, text):
        return {'prompt_tokens': tokens, 'tokens': 4, 'text': text, 's': tokens / 1000,
                'right': right}
    return {'item': item, 'task': 'needle', '1': cell(whole, 1000, texts[0]),
            '0.5': cell(half, 500, texts[1]), '0.25': cell(quarter, 250, texts[2])}


def test_a_share_keeps_the_right_answers_it_keeps_of_the_whole_contexts():
    rows = [row('a', True, True, False), row('b', True, True, True),
            row('c', False, True, False)]  # c: right only with less context
    summary = mcc.summary(rows, (0.5, 0.25))
    assert summary['1'] == {'right': 2, 'kept_of_whole_right': 2, 'whole_right': 2,
                            'likeness': 1.0, 'prompt_tokens': 1000, 'seconds': 1.0}
    # Likeness: ROUGE-L to the whole context's answer over every item ('a dock' shares
    # one of two words with 'the dock').
    assert summary['0.5']['likeness'] == 1.0 and summary['0.25']['likeness'] == 0.5
    assert summary['0.5']['right'] == 3 and summary['0.5']['kept_of_whole_right'] == 2
    assert summary['0.25']['kept_of_whole_right'] == 1 and summary['0.25']['prompt_tokens'] == 250
    report = {'date': 'today', 'command': 'c', 'commit': 'abc', 'machine': 'here',
              'items': 3, 'seed': 3, 'summary': summary}
    text = mcc.markdown(report)
    assert '| 0.25 | 1/3 | 1/2 | 0.50 | 0.50 | 250 |' in text
