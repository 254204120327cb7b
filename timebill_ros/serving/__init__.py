# SPDX-License-Identifier: Apache-2.0
"""ROS-free serving core: admission, scheduling, the worker, Skip-Next and ETE learning."""
