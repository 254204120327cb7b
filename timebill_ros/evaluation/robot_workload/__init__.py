# SPDX-License-Identifier: Apache-2.0
"""Generate, load and score the robot workload: short requests a robot or vehicle stack sends.

The workload imitates what an Autoware-style stack asks the embedded model before a
deadline. Kinds (``KINDS``), one generator module each:

- ``decision``: one-word decisions (STOP or GO, YES or NO, LEFT, RIGHT or STOP).
- ``number``: arithmetic on robot quantities and counting, answered with a number.
- ``unit``: unit conversions (km/h, m/s, mph, degrees, radians, metres, feet).
- ``json`` (``commands``): structured commands from a natural-language order.
- ``status``: ROS log excerpts (10 to 150 lines) to summarise in one sentence, or to
  name the node that logs an ERROR.
- ``checklist``, ``announcement``, ``explanation`` (``free_text``): free text.
- ``route``: route descriptions (3 to 150 segments) with counting and look-up questions.
- ``ifbench``: twenty short, command-like prompts from IFBench (free text here), read
  from ``data/ifbench_prompts.json``.

``generator.build`` makes every item from the templates (seeded, stdlib only) and
``python -m timebill_ros.evaluation.robot_workload --write`` writes them to
``data/robot_workload.jsonl``, which ``load`` reads (``items``). ``scoring.score``
checks an answer against an item's reference (None for free text).
"""

from .drafts import ROBOTS, STOPS
from .generator import build, EVALUATION_SEEDS, extra_train, fresh, main, TEST_SHARE
from .ifbench import IFBENCH_PROMPTS
from .items import DATA_FILE, dumps, KINDS, load, MATCHES, RobotItem, SPLITS
from .scoring import ABS_TOL, first_number, first_object, options, REL_TOL, score

__all__ = ['ABS_TOL', 'build', 'DATA_FILE', 'dumps', 'EVALUATION_SEEDS', 'extra_train',
           'first_number', 'first_object', 'fresh', 'IFBENCH_PROMPTS', 'KINDS', 'load',
           'main', 'MATCHES', 'options', 'REL_TOL', 'RobotItem', 'ROBOTS', 'score',
           'SPLITS', 'STOPS', 'TEST_SHARE']
