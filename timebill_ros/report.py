# SPDX-License-Identifier: Apache-2.0
"""Deadline report of a replay: the per-request CSV and a PNG rendered from it (no ROS).

The CSV (one row per request, ``COLUMNS``) is what ``timebill_bag replay``
writes; the PNG is rendered from the CSV alone, so ``timebill_bag report`` can
re-render it later. Three panels share the request axis: budget vs actual
end-to-end time coloured by outcome, the chosen KV-eviction ratio alpha, and
predicted / worst-case vs actual answer length.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Iterable, Sequence

COLUMNS = ('id', 'arrival_s', 'sent_s', 'budget_s', 'policy', 'mode', 'outcome',
           'deadline_met', 'e2e_s', 'queue_s', 'prefill_s', 'decode_s', 'tokens',
           'eviction_ratio', 'predicted_tokens', 'worst_case_tokens', 'est_wcet_s', 'reason')
FLOAT_COLUMNS = ('arrival_s', 'sent_s', 'budget_s', 'e2e_s', 'queue_s', 'prefill_s',
                 'decode_s', 'eviction_ratio', 'est_wcet_s')
INT_COLUMNS = ('policy', 'mode', 'tokens', 'predicted_tokens', 'worst_case_tokens')
# The columns a report needs; the others are for people reading the CSV.
REQUIRED = ('id', 'budget_s', 'outcome', 'deadline_met', 'e2e_s', 'tokens', 'eviction_ratio',
            'predicted_tokens', 'worst_case_tokens')
# Outcome name of a request whose Response never arrived.
MISSING = 'MISSING'

# Colour per outcome category (see category()).
COLOURS = {
    'met': '#2ca02c', 'late': '#ff7f0e', 'KILLED': '#d62728', 'SKIPPED': '#9467bd',
    'REJECTED': '#7f7f7f', 'CANCELED': '#8c564b', 'FAILED': '#000000', MISSING: '#ffffff',
}
LABELS = {'met': 'completed, deadline met', 'late': 'completed late', 'KILLED': 'killed',
          'SKIPPED': 'skipped', 'REJECTED': 'rejected', 'CANCELED': 'canceled',
          'FAILED': 'failed', MISSING: 'no response'}


class ReportError(Exception):
    """The CSV cannot be read as a replay report, or the PNG cannot be written."""


def write_csv(path, rows: Iterable[dict]) -> Path:
    """Write report rows (dicts keyed by ``COLUMNS``; None -> empty) to ``path``."""
    path = Path(path)
    try:
        with path.open('w', newline='', encoding='utf-8') as stream:
            writer = csv.DictWriter(stream, fieldnames=COLUMNS, extrasaction='raise')
            writer.writeheader()
            for row in rows:
                writer.writerow({key: _cell(row.get(key)) for key in COLUMNS})
    except OSError as exc:
        raise ReportError(f'cannot write {path}: {exc.strerror or exc}') from exc
    return path


def _cell(value):
    if value is None:
        return ''
    if isinstance(value, bool):
        return 'true' if value else 'false'
    if isinstance(value, float):
        return '' if math.isnan(value) else repr(value)
    return value


def read_csv(path) -> list:
    """Return the typed rows of a report CSV (numbers as float/int, NaN/None when empty)."""
    path = Path(path)
    try:
        with path.open(newline='', encoding='utf-8') as stream:
            reader = csv.DictReader(stream)
            missing = [c for c in REQUIRED if c not in (reader.fieldnames or ())]
            if missing:
                raise ReportError(f'{path} is not a replay report CSV: no column(s) '
                                  f'{", ".join(missing)}')
            raw_rows = list(reader)
    except OSError as exc:
        raise ReportError(f'cannot read {path}: {exc.strerror or exc}') from exc
    except (csv.Error, UnicodeDecodeError) as exc:
        raise ReportError(f'{path} is not a CSV file: {exc}') from exc
    return [_typed(path, line, row) for line, row in enumerate(raw_rows, start=2)]


def _typed(path: Path, line: int, row: dict) -> dict:
    out = dict(row)
    try:
        for key in FLOAT_COLUMNS:
            if key in row:
                out[key] = float(row[key]) if row[key] not in ('', None) else math.nan
        for key in INT_COLUMNS:
            if key in row:
                out[key] = int(float(row[key])) if row[key] not in ('', None) else None
    except ValueError as exc:
        raise ReportError(f'{path} line {line}: {exc}') from exc
    met = (row.get('deadline_met') or '').strip().lower()
    if met not in ('true', 'false', '1', '0', ''):
        raise ReportError(f'{path} line {line}: deadline_met must be true or false '
                          f'(got {row.get("deadline_met")!r})')
    out['deadline_met'] = met in ('true', '1')
    out['outcome'] = (row.get('outcome') or MISSING).strip().upper()
    return out


def category(row: dict) -> str:
    """Return the colour category of a row: met, late, or the outcome name."""
    if row['outcome'] == 'COMPLETED':
        return 'met' if row['deadline_met'] else 'late'
    return row['outcome'] if row['outcome'] in COLOURS else 'FAILED'


def summary(rows: Sequence[dict]) -> str:
    """Return a one-line count of requests by outcome category."""
    counts = {}
    for row in rows:
        counts[category(row)] = counts.get(category(row), 0) + 1
    met = sum(1 for row in rows if row['deadline_met'])
    parts = [f'{counts[key]} {LABELS[key]}' for key in COLOURS if counts.get(key)]
    return f'{len(rows)} requests, deadline met by {met}: ' + (', '.join(parts) or 'none')


def render(csv_path, png_path=None, title: str | None = None) -> Path:
    """Render the deadline report PNG of a report CSV; return the PNG path.

    ``png_path`` defaults to the CSV path with a ``.png`` suffix.
    """
    csv_path = Path(csv_path)
    png_path = Path(png_path) if png_path else csv_path.with_suffix('.png')
    rows = read_csv(csv_path)
    figure = build_figure(rows, title or csv_path.stem)
    try:
        figure.savefig(png_path, format='png', dpi=100)
    except OSError as exc:
        raise ReportError(f'cannot write {png_path}: {exc.strerror or exc}') from exc
    return png_path


def build_figure(rows: Sequence[dict], title: str = ''):
    """Return the matplotlib Figure of the report (Agg canvas, no pyplot state)."""
    # Figure + Agg canvas directly: no display, no global backend switch.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    n = len(rows)
    # Constrained layout keeps the legends placed outside the axes inside the figure.
    figure = Figure(figsize=(min(24.0, max(9.0, 0.4 * n + 4.0)), 9.0), layout='constrained')
    FigureCanvasAgg(figure)
    time_ax, alpha_ax, length_ax = figure.subplots(3, 1, sharex=True,
                                                   gridspec_kw={'height_ratios': [3, 1, 2]})
    figure.suptitle(f'{title}\n{summary(rows)}' if title else summary(rows), fontsize=10)
    x = list(range(n))
    cats = [category(row) for row in rows]
    colours = [COLOURS[c] for c in cats]
    edges = ['#d62728' if c == MISSING else '#333333' for c in cats]
    legend = {'fontsize': 8, 'loc': 'upper left', 'bbox_to_anchor': (1.01, 1.0)}

    _time_panel(time_ax, rows, x, cats, colours, edges)
    present = [c for c in COLOURS if c in cats]
    handles = [Patch(facecolor=COLOURS[c], edgecolor='#333333', hatch='//' if c == MISSING
                     else '', label=LABELS[c]) for c in present]
    handles.append(Line2D([], [], color='black', linewidth=2.0, label='budget'))
    time_ax.legend(handles=handles, **legend)

    alphas = [_zero_nan(row['eviction_ratio']) for row in rows]
    alpha_ax.bar(x, alphas, color='#1f77b4', width=0.5)
    ran = [(i, a) for i, a, c in zip(x, alphas, cats) if c != MISSING]
    if ran:
        alpha_ax.plot(*zip(*ran), 'o', color='#1f77b4', markersize=4)
    alpha_ax.set_ylim(-0.03, 1.0)
    alpha_ax.set_ylabel('alpha')
    alpha_ax.set_title('chosen KV-eviction ratio', fontsize=9)
    if n and not any(alphas):
        alpha_ax.text(0.5, 0.6, 'no eviction planned (alpha = 0 for every request)',
                      transform=alpha_ax.transAxes, ha='center', fontsize=8, color='#555555')

    length_ax.bar(x, [row['tokens'] or 0 for row in rows], color=colours, edgecolor=edges,
                  linewidth=0.6)
    predicted = [(i, row['predicted_tokens']) for i, row in zip(x, rows)
                 if row['predicted_tokens']]
    worst = [(i, row['worst_case_tokens']) for i, row in zip(x, rows)
             if row['worst_case_tokens']]
    if predicted:
        length_ax.plot(*zip(*predicted), 'o', color='#1f77b4', label='predicted')
    if worst:
        length_ax.plot(*zip(*worst), 'v', color='#d62728', label='worst case (k x predicted)')
    length_ax.set_ylabel('tokens')
    length_ax.set_title('answer length: actual (bars, coloured by outcome) vs predicted'
                        + ('' if predicted or not n else
                           ' - no predictions: the node planned without a length predictor'),
                        fontsize=9)
    handles = [Patch(facecolor='#cccccc', edgecolor='#333333', label='actual tokens')]
    length_ax.legend(handles=handles + length_ax.get_legend_handles_labels()[0], **legend)

    length_ax.set_xlim(-0.6, max(n, 1) - 0.4)
    if 0 < n <= 40:
        length_ax.set_xticks(x)
        length_ax.set_xticklabels([row['id'] for row in rows], rotation=60, ha='right',
                                  fontsize=7)
    else:
        length_ax.set_xlabel('request (in arrival order)')
    if not n:
        time_ax.text(0.5, 0.5, 'no requests', transform=time_ax.transAxes, ha='center')
    return figure


def _time_panel(ax, rows, x, cats, colours, edges) -> None:
    """Draw end-to-end bars (budget-high hatched bars for missing answers) and budget lines."""
    budgets = [_zero_nan(row['budget_s']) for row in rows]
    e2e = [b if c == MISSING else _zero_nan(row['e2e_s'])
           for row, b, c in zip(rows, budgets, cats)]
    positive = [v for v in e2e + budgets if v > 0.0]
    # Budgets of seconds next to answers of milliseconds: only a log axis shows both.
    log = bool(positive) and max(positive) / min(positive) > 20.0
    floor = min(positive) / 2.0 if log else 0.0
    if log:
        ax.set_yscale('log')
    heights = [max(v - floor, 0.0) for v in e2e]
    bars = ax.bar(x, heights, bottom=floor, color=colours, edgecolor=edges, linewidth=0.6)
    for bar, cat in zip(bars, cats):
        if cat == MISSING:
            bar.set_hatch('//')
    # Requests that never ran (e2e 0) get a marker so they are not invisible.
    idle = [(i, colour) for i, v, colour in zip(x, e2e, colours) if v <= floor]
    if idle:
        ax.scatter([i for i, _ in idle], [floor if log else 0.0] * len(idle), marker='X',
                   s=60, c=[colour for _, colour in idle], edgecolors='#333333', zorder=3,
                   clip_on=False)
    if rows:
        ax.hlines(budgets, [i - 0.45 for i in x], [i + 0.45 for i in x], colors='black',
                  linewidths=2.0, zorder=4)
    ax.set_ylabel('seconds' + (' (log)' if log else ''))
    ax.set_title('end-to-end time (bars) vs budget (black line)', fontsize=9)


def _zero_nan(value) -> float:
    return 0.0 if value is None or math.isnan(value) else value
