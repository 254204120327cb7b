# SPDX-License-Identifier: Apache-2.0
"""core layer of timebill_ros."""
