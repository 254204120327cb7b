#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build and test timebill_ros as a user's workspace would: a clean copy of the committed
# tree in <ws>/src, `colcon build` (both packages: timebill_msgs, then timebill_ros),
# `colcon test`, `colcon test-result`.
#   scripts/workspace_check.sh [WS]     (default: a new temporary directory)
#   PYTEST_ADDOPTS='-k config' scripts/workspace_check.sh   # a subset of the suite
# Needs the checkout's .venv (make venv): it stands in for a ROS 2 install + pip deps.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
ws="${1:-$(mktemp -d /tmp/timebill_ws.XXXXXX)}"
mkdir -p "$ws/src/timebill_ros"
git -C "$root" archive HEAD | tar -x -C "$ws/src/timebill_ros"
# The venv is the ROS 2 underlay (as env.sh sets it up, without the checkout's install/).
set +u
# shellcheck disable=SC1091
. "$root/.venv/bin/activate"
set -u
for libs in "$VIRTUAL_ENV/lib" "$VIRTUAL_ENV"/lib/python3*/site-packages/ros_*.libs; do
  LD_LIBRARY_PATH="$libs:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH RMW_IMPLEMENTATION=rmw_fastrtps_cpp
export AMENT_PREFIX_PATH="$VIRTUAL_ENV" CMAKE_PREFIX_PATH="$VIRTUAL_ENV"
cd "$ws"
echo "== colcon build in $ws"
COLCON_PREFIX_PATH= colcon build --event-handlers console_cohesion+ \
  --cmake-args -DPython3_EXECUTABLE="$VIRTUAL_ENV/bin/python"
set +u
# shellcheck disable=SC1091
. install/setup.bash
set -u
echo "== packages built:"
ls install/timebill_msgs/share/timebill_msgs/action install/timebill_ros/share/timebill_ros
echo "== tools on the install's lib/timebill_ros:"
ls install/timebill_ros/lib/timebill_ros
echo "== colcon test"
colcon test --packages-select timebill_msgs timebill_ros --event-handlers console_cohesion+ \
  || true
colcon test-result --verbose
