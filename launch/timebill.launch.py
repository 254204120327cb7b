"""Launch the timebill node (needs a ROS 2 install with launch and launch_ros)."""

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
    # The plain and the managed node differ only in the action class and --managed.
    common = dict(package='timebill_ros', executable='timebill_node', name='timebill',
                  namespace=LaunchConfiguration('namespace'),
                  parameters=[LaunchConfiguration('params_file')], output='screen')
    managed = LaunchConfiguration('managed')
    return LaunchDescription([
        DeclareLaunchArgument(
            'namespace', default_value='',
            description='Namespace for the timebill node and its topics/action/service.'),
        DeclareLaunchArgument(
            'params_file', default_value=default_params,
            description='YAML parameters file for the timebill node.'),
        DeclareLaunchArgument(
            'managed', default_value='false',
            description='true: run as a lifecycle (managed) node that loads the model on '
                        'configure and serves once activated; false: serve at start.'),
        Node(**common, condition=UnlessCondition(managed)),
        LifecycleNode(**common, arguments=['--managed'], condition=IfCondition(managed)),
    ])
