# SPDX-License-Identifier: Apache-2.0
"""runtime layer of timebill_ros."""
