"""User tools of timebill_ros: ask, monitor, bag, calibrate, schema, demo, fleet demo."""
