"""core layer of timebill_ros."""
