# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Environment for timebill_ros: source it (bash or zsh), from any directory:
#
#     . /path/to/timebill_ros/env.sh
#
# Activates .venv (ROS 2 Kilted from PyPI wheels, torch, transformers, ...),
# puts the wheels' shared libraries on LD_LIBRARY_PATH, selects Fast DDS and
# sources the colcon install tree (install/setup.bash) when it exists.
# From a shell that is neither bash nor zsh, set TIMEBILL_ROOT to the checkout first.
# Exports TIMEBILL_ROOT (the checkout's absolute path).

if [ -n "${BASH_VERSION:-}" ]; then
  _tb_self="${BASH_SOURCE[0]}"
elif [ -n "${ZSH_VERSION:-}" ]; then
  # shellcheck disable=SC2296
  _tb_self="${(%):-%x}"
else
  _tb_self=""
fi
if [ -n "$_tb_self" ]; then
  _tb_root="$(cd "$(dirname "$_tb_self")" && pwd -P)"
elif [ -n "${TIMEBILL_ROOT:-}" ]; then
  _tb_root="$TIMEBILL_ROOT"
else
  echo "env.sh: cannot locate myself in this shell; set TIMEBILL_ROOT" >&2
  return 1 2>/dev/null || exit 1
fi
unset _tb_self

# The venv's activate and colcon's setup scripts read unset variables.
case $- in *u*) _tb_nounset=1; set +u ;; *) _tb_nounset=0 ;; esac

_tb_rc=0
if [ -f "$_tb_root/.venv/bin/activate" ]; then
  # shellcheck disable=SC1091
  . "$_tb_root/.venv/bin/activate"
else
  echo "env.sh: $_tb_root/.venv missing; run 'make venv' first" >&2
  _tb_rc=1
fi

if [ "$_tb_rc" -eq 0 ]; then
  # _tb_prepend VAR DIR: put DIR first in the colon list VAR, once.
  _tb_prepend() {
    eval "_tb_cur=\${$1:-}"
    case ":$_tb_cur:" in
      *":$2:"*) ;;
      *) if [ -n "$_tb_cur" ]; then eval "export $1=\"\$2:\$_tb_cur\""; else eval "export $1=\"\$2\""; fi ;;
    esac
    unset _tb_cur
  }

  # The ROS 2 wheels keep their libraries in site-packages/ros_*.libs and
  # $VIRTUAL_ENV/lib; rclpy cannot load librmw_fastrtps_cpp.so etc. without them.
  _tb_prepend LD_LIBRARY_PATH "$VIRTUAL_ENV/lib"
  for _tb_d in "$VIRTUAL_ENV"/lib/python3*/site-packages/ros_*.libs; do
    [ -d "$_tb_d" ] && _tb_prepend LD_LIBRARY_PATH "$_tb_d"
  done
  unset _tb_d

  # The venv is the ROS 2 "underlay": ament index + CMake configs live there.
  _tb_prepend AMENT_PREFIX_PATH "$VIRTUAL_ENV"
  _tb_prepend CMAKE_PREFIX_PATH "$VIRTUAL_ENV"
  export RMW_IMPLEMENTATION=rmw_fastrtps_cpp

  # The repository's install tree (timebill_msgs' generated interfaces, timebill_ros).
  if [ -n "${ZSH_VERSION:-}" ] && [ -f "$_tb_root/install/setup.zsh" ]; then
    # shellcheck disable=SC1091
    . "$_tb_root/install/setup.zsh"
  elif [ -f "$_tb_root/install/setup.bash" ] && [ -n "${BASH_VERSION:-}" ]; then
    # shellcheck disable=SC1091
    . "$_tb_root/install/setup.bash"
  elif [ -f "$_tb_root/install/setup.sh" ]; then
    # colcon's setup.sh needs COLCON_CURRENT_PREFIX outside bash/zsh.
    COLCON_CURRENT_PREFIX="$_tb_root/install" . "$_tb_root/install/setup.sh"
  fi
  # The package's tools (timebill_ask, timebill_monitor, ...), the names `ros2 run
  # timebill_ros <tool>` runs on a full ROS 2 install (ros2cli is not on PyPI).
  if [ -d "$_tb_root/install/timebill_ros/lib/timebill_ros" ]; then
    _tb_prepend PATH "$_tb_root/install/timebill_ros/lib/timebill_ros"
  fi
  unset -f _tb_prepend
  export TIMEBILL_ROOT="$_tb_root"
fi

if [ "$_tb_nounset" -eq 1 ]; then set -u; fi
unset _tb_nounset _tb_root
# Status of the source command: 0 when the environment is ready.
if [ "$_tb_rc" -eq 0 ]; then unset _tb_rc; true; else unset _tb_rc; false; fi
