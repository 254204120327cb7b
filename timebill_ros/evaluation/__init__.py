# SPDX-License-Identifier: Apache-2.0
"""TimeBill evaluation: packaged tasks, the robot workload, length data and metrics."""
