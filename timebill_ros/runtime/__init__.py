"""runtime layer of timebill_ros."""
