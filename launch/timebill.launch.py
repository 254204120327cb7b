# SPDX-License-Identifier: Apache-2.0
"""Launch the timebill node (needs a ROS 2 install with launch and launch_ros).

    ros2 launch timebill_ros timebill.launch.py namespace:=robot1 managed:=true autostart:=true
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.conditions import IfCondition, UnlessCondition
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import LifecycleNode, Node


def generate_launch_description():
    default_params = os.path.join(
        get_package_share_directory('timebill_ros'), 'config', 'timebill.yaml')
    # Launch arguments override the parameters file (later entries win in launch_ros).
    overrides = {'use_sim_time': LaunchConfiguration('use_sim_time'),
                 'autostart': LaunchConfiguration('autostart')}
    # The plain and the managed node differ only in the action class and --managed.
    common = dict(package='timebill_ros', executable='timebill_node', name='timebill',
                  namespace=LaunchConfiguration('namespace'),
                  parameters=[LaunchConfiguration('params_file'), overrides],
                  ros_arguments=['--log-level', LaunchConfiguration('log_level')],
                  output='screen')
    managed = LaunchConfiguration('managed')
    return LaunchDescription([
        DeclareLaunchArgument(
            'namespace', default_value='',
            description='Namespace for the timebill node and its topics/action/service.'),
        DeclareLaunchArgument(
            'params_file', default_value=default_params,
            description='YAML parameters file for the timebill node (the shipped one holds '
                        'the defaults the code declares).'),
        DeclareLaunchArgument(
            'managed', default_value='false',
            description='true: run as a lifecycle (managed) node that loads the model on '
                        'configure and serves once activated; false: serve at start.'),
        DeclareLaunchArgument(
            'autostart', default_value='false',
            description='With managed:=true, configure and activate at start (no lifecycle '
                        'manager needed); ignored by the plain node.'),
        DeclareLaunchArgument(
            'use_sim_time', default_value='false',
            description='true: the node clock follows /clock (a replayed bag); absolute goal '
                        'deadlines and result stamps are then in sim time.'),
        DeclareLaunchArgument(
            'log_level', default_value='info',
            description='Logger level of the node: debug, info, warn, error or fatal.'),
        Node(**common, condition=UnlessCondition(managed)),
        LifecycleNode(**common, arguments=['--managed'], condition=IfCondition(managed)),
    ])
