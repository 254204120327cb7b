"""ROS-free serving core: admission, scheduling, the worker, Skip-Next and ETE learning."""
