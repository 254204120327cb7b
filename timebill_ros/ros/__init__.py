"""ros layer of timebill_ros."""
