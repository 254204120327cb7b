# SPDX-License-Identifier: Apache-2.0
"""PNG plots of a TimeBill benchmark report (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path


def _pyplot():
    import matplotlib
    matplotlib.use('Agg')  # files only: works without a display
    import matplotlib.pyplot as plt
    return plt


def sweep(report: dict, key: str, ylabel: str, path: Path) -> Path:
    """Plot ``key`` (completion_rate or avg_score) vs budget per strategy, one panel a policy."""
    plt = _pyplot()
    policies = list(report['sweep'])
    fig, axes = plt.subplots(1, len(policies), figsize=(6 * len(policies), 4.2), squeeze=False)
    for ax, policy in zip(axes[0], policies):
        for strategy, rows in report['sweep'][policy].items():
            budgets = [row['budget_s'] for row in rows]
            values = [row[key] for row in rows]
            style = '-o' if strategy.startswith('TimeBill') else '--.'
            ax.plot(budgets, values, style, label=strategy, linewidth=2 if
                    strategy.startswith('TimeBill') else 1)
        ax.set_title(f'{policy}')
        ax.set_xlabel('time budget (s)')
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc='best')
    fig.suptitle(f"{ylabel} vs budget ({report['machine_short']}, {report['date']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def scatter(points: list, path: Path, title: str) -> Path:
    """Plot estimated vs measured seconds (points: (estimate, actual, label))."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 5))
    labels = sorted({label for _, _, label in points})
    for label in labels:
        xs = [a for e, a, lab in points if lab == label]
        ys = [e for e, a, lab in points if lab == label]
        ax.scatter(xs, ys, s=16, label=label)
    top = max([max(e, a) for e, a, _ in points] + [1.0]) * 1.05
    ax.plot([0, top], [0, top], 'k:', linewidth=1, label='estimate = actual')
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel('measured (s)')
    ax.set_ylabel('estimated (s)')
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ablation(rows: list, x: str, xlabel: str, path: Path, title: str) -> Path:
    """Plot completion rate and average score against an ablated setting."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [row[x] for row in rows]
    ax.plot(xs, [row['completion_rate'] for row in rows], '-o', label='completion rate')
    ax.plot(xs, [row['avg_score'] for row in rows], '-s', label='average score')
    ax.set_xlabel(xlabel)
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
