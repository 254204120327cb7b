# SPDX-License-Identifier: Apache-2.0
"""The benchmarks' shared helpers: the CPU steal meter."""

from benchmarks.common import cpu_times, StealMeter


def test_cpu_times_reads_steal_and_the_total_of_the_first_line(tmp_path):
    stat = tmp_path / 'stat'
    stat.write_text('cpu  100 5 50 800 10 0 5 30 0 0\ncpu0 50 2 25 400 5 0 2 15 0 0\n')
    assert cpu_times(str(stat)) == (30, 1000)
    assert cpu_times(str(tmp_path / 'absent')) is None
    stat.write_text('intr 1 2 3\n')
    assert cpu_times(str(stat)) is None


def test_steal_meter_reports_each_phase_since_the_last_call():
    readings = iter([(0, 1000), (50, 2000), (50, 3000), (50, 3000)])
    meter = StealMeter(lambda: next(readings))
    assert meter.share() == 0.05
    assert meter.share() == 0.0
    assert meter.share() is None  # no time passed


def test_steal_meter_is_none_where_proc_stat_is_absent():
    assert StealMeter(lambda: None).share() is None


def test_steal_meter_reads_this_machine():
    share = StealMeter().share()
    assert share is None or 0.0 <= share <= 1.0
