# SPDX-License-Identifier: Apache-2.0
"""The lab: benchmarks, evaluators and experiments over timebill_ros (not installed).

Run from the repository root as ``python -m benchmarks.<name>`` (the ``make bench*``
targets do). Every benchmark starts its nodes, sends its workload and writes its results
folder through ``benchmarks.harness``; paths come from ``benchmarks.paths``. The product
(``timebill_ros``) never imports this package.
"""
