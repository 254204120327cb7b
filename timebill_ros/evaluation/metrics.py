"""Answer metrics: SQuAD token F1 / exact match, ROUGE-L (rouge-score), per task."""

from __future__ import annotations

from timebill_ros.cli.bench_eviction import exact_match, normalize_answer, token_f1


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
