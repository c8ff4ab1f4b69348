"""shell_repo: an agent with a real shell in the sandbox on generated multi-file repositories,
graded fail-to-pass by hidden tests (issue 31 items 1-3). See task.py for the episode, env.py for
the rules and milestones, oracle.py for the grading, tools.py for the shell and its pytest."""

from temper.envs.shell_repo.task import ShellRepoConfig, ShellRepoTask

__all__ = ["ShellRepoConfig", "ShellRepoTask"]
