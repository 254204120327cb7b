# SPDX-License-Identifier: Apache-2.0
"""One-off probes that results/ READMEs cite: each runs as ``python -m benchmarks.probes.<name>``.

They import internals of timebill_ros on purpose (to look at one mechanism in isolation);
lint and the smoke test (test/benchmarks/test_smoke.py) keep them importable.
"""
