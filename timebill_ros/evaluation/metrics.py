# SPDX-License-Identifier: Apache-2.0
"""Answer metrics: SQuAD token F1 / exact match, ROUGE-L (rouge-score), per task."""

from __future__ import annotations

from collections import Counter
import re
import string


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and articles, squeeze whitespace (SQuAD rules)."""
    text = ''.join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r'\b(a|an|the)\b', ' ', text)
    return ' '.join(text.split())


def exact_match(prediction: str, reference: str) -> float:
    """Return 1.0 when the normalised prediction equals the normalised reference."""
    return float(normalize_answer(prediction) == normalize_answer(reference))


def token_f1(prediction: str, reference: str) -> float:
    """Return the bag-of-tokens F1 of the normalised strings (HotpotQA's rules).

    As in the official HotpotQA script, yes/no/noanswer references only score
    when the normalised prediction is exactly that word.
    """
    pred, ref = normalize_answer(prediction), normalize_answer(reference)
    special = ('yes', 'no', 'noanswer')
    if (pred in special or ref in special) and pred != ref:
        return 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    common = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def rouge_l(prediction: str, reference: str) -> float:
    """Return the ROUGE-L F-measure (rouge-score, stemmed) of one answer."""
    from rouge_score import rouge_scorer
    scorer = rouge_scorer.RougeScorer(['rougeL'], use_stemmer=True)
    return float(scorer.score(reference, prediction)['rougeL'].fmeasure)


def contains(prediction: str, reference: str) -> float:
    """Return 1.0 when the normalised reference occurs in the normalised prediction."""
    wanted = normalize_answer(reference)
    return float(bool(wanted) and wanted in normalize_answer(prediction))


FUNCTIONS = {'f1': token_f1, 'em': exact_match, 'rougeL': rouge_l, 'contains': contains}


def score(metric: str, prediction: str, references: list) -> float:
    """Score ``prediction`` with ``metric``: the best over the references, in [0, 1]."""
    if metric not in FUNCTIONS:
        raise ValueError(f'unknown metric {metric!r} (expected one of {sorted(FUNCTIONS)})')
    if not references:
        raise ValueError('no reference to score against')
    return max(FUNCTIONS[metric](prediction, ref) for ref in references)
