"""Verifiable single-turn tasks: problems of a split, a prompt, a grade (`base.py`). Tasks are
looked up by name in `temper.catalog`, which also holds the environment tasks of `temper.envs`."""

from temper.tasks.arithmetic import Arithmetic, ArithmeticConfig
from temper.tasks.base import Problem, Score, Task, TaskOptionError
from temper.tasks.dataset_task import DataTask, DataTaskConfig
from temper.tasks.general_points import GeneralPoints, GeneralPointsConfig
from temper.tasks.instructed import InstructedArithmetic
from temper.tasks.reasoning_gym_task import ReasoningGym, ReasoningGymConfig
from temper.tasks.two_mode import TwoMode, TwoModeConfig

__all__ = [
    "Arithmetic",
    "ArithmeticConfig",
    "DataTask",
    "DataTaskConfig",
    "GeneralPoints",
    "GeneralPointsConfig",
    "InstructedArithmetic",
    "Problem",
    "ReasoningGym",
    "ReasoningGymConfig",
    "Score",
    "Task",
    "TaskOptionError",
    "TwoMode",
    "TwoModeConfig",
]
