# SPDX-License-Identifier: Apache-2.0
"""ros layer of timebill_ros."""
