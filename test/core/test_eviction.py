# SPDX-License-Identifier: Apache-2.0
"""alpha*: closed form vs numeric search, monotonicity and feasibility (hypothesis)."""

from hypothesis import given, settings, strategies as st
import pytest

from timebill_ros.core.eviction import search_alpha, solve_alpha
from timebill_ros.core.timing import TimingModel

models = st.builds(
    TimingModel,
    a=st.floats(0, 1e-6), b=st.floats(0, 1e-3), c=st.floats(0, 0.1),
    p=st.floats(1e-7, 1e-4), q=st.floats(1e-3, 0.1))
n_x = st.integers(1, 8000)
tokens = st.integers(1, 1024)
budget = st.floats(0.0, 200.0)
alpha_max = st.floats(0.0, 0.99)


@settings(max_examples=300, deadline=None)
@given(models, n_x, tokens, budget, alpha_max)
def test_alpha_in_range_and_feasibility_exact(model, n, w, t, amax):
    d = solve_alpha(model, n, w, t, amax)
    assert 0.0 <= d.alpha <= amax
    infeasible = model.wcet(n, amax, w) > t
    # Exactly the infeasible cases are flagged (tolerance for float rounding at the edge).
    if abs(model.wcet(n, amax, w) - t) > 1e-9 * max(1.0, t):
        assert d.feasible == (not infeasible)
    if d.feasible:
        # Strictly: the planner compares the same way, so a hair above is a rejection.
        assert model.wcet(n, d.alpha, w) <= t and d.wcet_s == model.wcet(n, d.alpha, w)


@settings(max_examples=300, deadline=None)
@given(models, n_x, st.integers(2, 1024), st.floats(0.0, 1.0), alpha_max)
def test_every_budget_between_the_bounds_is_met_with_an_interior_alpha(model, n, w, share,
                                                                       amax):
    # Budgets strictly between WCET(alpha_max) and WCET(0) are where the root is
    # interior, so WCET(alpha*) equals the budget up to rounding.
    low, high = model.wcet(n, amax, w), model.wcet(n, 0.0, w)
    t = low + share * (high - low)
    d = solve_alpha(model, n, w, t, amax)
    assert d.feasible and model.wcet(n, d.alpha, w) <= t


@settings(max_examples=300, deadline=None)
@given(models, n_x, tokens, budget, st.floats(0.0, 50.0), alpha_max)
def test_more_budget_never_gives_larger_alpha(model, n, w, t, extra, amax):
    assert solve_alpha(model, n, w, t + extra, amax).alpha <= \
        solve_alpha(model, n, w, t, amax).alpha + 1e-12


@settings(max_examples=200, deadline=None)
@given(models, n_x, st.integers(1, 300), budget, alpha_max)
def test_closed_form_equals_numeric_search(model, n, w, t, amax):
    closed = solve_alpha(model, n, w, t, amax)
    searched = search_alpha(model, n, w, t, amax)
    assert closed.feasible == searched.feasible or \
        abs(model.wcet(n, amax, w) - t) < 1e-9 * max(1.0, t)
    if closed.feasible and searched.feasible:
        assert closed.alpha == pytest.approx(searched.alpha, abs=1e-6)


def test_example_by_hand():
    model = TimingModel(0.0, 0.001, 0.0, 1e-5, 0.03)  # prefill 2 s at 2000 tokens
    # 100 tokens: WCET(0) = 2 + 99*(0.03 + 1e-5*2000) + 1e-5*99*98/2 = 7.0001...
    full = model.wcet(2000, 0.0, 100)
    assert solve_alpha(model, 2000, 100, full + 1.0).alpha == 0.0
    d = solve_alpha(model, 2000, 100, full - 1.0)
    assert d.feasible and d.alpha > 0
    assert model.wcet(2000, d.alpha, 100) == pytest.approx(full - 1.0)
    assert not solve_alpha(model, 2000, 100, 1.0).feasible


def test_bad_arguments():
    model = TimingModel(0, 0, 0, 1e-5, 0.03)
    with pytest.raises(ValueError):
        solve_alpha(model, 100, 10, 1.0, alpha_max=1.0)
    with pytest.raises(ValueError):
        solve_alpha(model, 0, 10, 1.0)
