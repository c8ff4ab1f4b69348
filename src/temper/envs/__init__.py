"""Multi-turn environments (issue 9): treasure_hunt and its tabular Q-learning baseline."""
