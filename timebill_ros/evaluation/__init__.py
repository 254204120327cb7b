"""TimeBill evaluation: packaged tasks, the robot workload, length data and metrics."""
