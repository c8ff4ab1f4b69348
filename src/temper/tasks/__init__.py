"""Verifiable single-turn tasks: problems of a split, a prompt, a grade (`base.py`). Tasks are
looked up by name in `temper.catalog`, which also holds the environment tasks of `temper.envs`."""

from typing import TYPE_CHECKING

from temper.lazy import exports

if TYPE_CHECKING:  # the names, for type checkers; imported on first use (temper.lazy)
    from temper.tasks.arithmetic import Arithmetic, ArithmeticConfig
    from temper.tasks.base import Problem, Score, Task, TaskOptionError
    from temper.tasks.dataset_task import DataTask, DataTaskConfig
    from temper.tasks.general_points import GeneralPoints, GeneralPointsConfig
    from temper.tasks.instructed import InstructedArithmetic
    from temper.tasks.language import Language
    from temper.tasks.reasoning_gym_task import ReasoningGym, ReasoningGymConfig
    from temper.tasks.thinking_language import ThinkingLanguage, ThinkingLanguageConfig
    from temper.tasks.translated import Translated, TranslatedConfig
    from temper.tasks.two_mode import TwoMode, TwoModeConfig

__getattr__, __dir__ = exports(
    globals(),
    {
        "Arithmetic": "arithmetic",
        "ArithmeticConfig": "arithmetic",
        "Problem": "base",
        "Score": "base",
        "Task": "base",
        "TaskOptionError": "base",
        "DataTask": "dataset_task",
        "DataTaskConfig": "dataset_task",
        "GeneralPoints": "general_points",
        "GeneralPointsConfig": "general_points",
        "InstructedArithmetic": "instructed",
        "ReasoningGym": "reasoning_gym_task",
        "ReasoningGymConfig": "reasoning_gym_task",
        "Language": "language",
        "ThinkingLanguage": "thinking_language",
        "ThinkingLanguageConfig": "thinking_language",
        "Translated": "translated",
        "TranslatedConfig": "translated",
        "TwoMode": "two_mode",
        "TwoModeConfig": "two_mode",
    },
)

__all__ = [
    "Arithmetic",
    "ArithmeticConfig",
    "DataTask",
    "DataTaskConfig",
    "GeneralPoints",
    "GeneralPointsConfig",
    "InstructedArithmetic",
    "Language",
    "Problem",
    "ReasoningGym",
    "ReasoningGymConfig",
    "Score",
    "Task",
    "TaskOptionError",
    "ThinkingLanguage",
    "ThinkingLanguageConfig",
    "Translated",
    "TranslatedConfig",
    "TwoMode",
    "TwoModeConfig",
]
