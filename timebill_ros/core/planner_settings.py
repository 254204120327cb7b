# SPDX-License-Identifier: Apache-2.0
"""The planner's settings, taken from the node's configuration.

The defaults, ranges and meaning of each value live in core.config's parameter
table only; this holds no defaults of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from timebill_ros.core.config import NodeConfig

INFEASIBLE_POLICIES = ('reject', 'best_effort')


@dataclass(frozen=True)
class PlannerSettings:
    """Node parameters the planner reads (named as in core.config.PARAMS)."""

    alpha_max: float
    press: str
    infeasible: str
    time_margin: float
    tpot_jitter: float
    plan_quantile: float
    admit_probability: float
    choice_quantile: float
    fit_tolerance: float
    min_cut_saving: float
    auto_early_exit: bool
    min_switch_speedup: float
    deadline_closure: bool
    count_time_errors: bool
    length_hedge: float
    fidelity_tolerance: float
    llama_handover: bool

    def __post_init__(self):
        """Raise ValueError on settings the planner cannot work with."""
        if self.min_switch_speedup < 1.0:
            raise ValueError(f'min_switch_speedup must be >= 1 (got {self.min_switch_speedup})')
        if not 0.0 <= self.time_margin < 1.0:
            raise ValueError(f'time_margin must be in [0, 1) (got {self.time_margin})')
        if not 0.0 <= self.alpha_max < 1.0:
            raise ValueError(f'alpha_max must be in [0, 1) (got {self.alpha_max})')
        if self.infeasible not in INFEASIBLE_POLICIES:
            raise ValueError(f'infeasible must be one of {INFEASIBLE_POLICIES}')
        for name in ('plan_quantile', 'admit_probability', 'choice_quantile', 'fit_tolerance',
                     'min_cut_saving', 'length_hedge', 'fidelity_tolerance'):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f'{name} must be in [0, 1] (got {value})')

    @classmethod
    def from_config(cls, config: NodeConfig) -> 'PlannerSettings':
        """Return the settings ``config`` gives (each field is the parameter of its name)."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls)})
