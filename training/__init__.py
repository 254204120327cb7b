# SPDX-License-Identifier: Apache-2.0
"""Builders of the data timebill_ros ships (timebill_ros/data; not installed).

Run from the repository root as ``python -m training.<name>`` (``make measure-cuts``,
``make measure-precision``). Each writes a shipped table or head (``--ship``) or a
results folder; paths come from ``benchmarks.paths``. The product never imports this
package.
"""
