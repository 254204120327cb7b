# SPDX-License-Identifier: Apache-2.0
"""User tools of timebill_ros: ask, monitor, bag, calibrate, schema, demo, fleet demo."""
