"""cli layer of timebill_ros."""
