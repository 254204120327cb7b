"""TimeBill evaluation: packaged long-context tasks, metrics, policy replay and plots."""
