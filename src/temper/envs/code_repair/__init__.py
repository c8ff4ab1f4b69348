"""The code_repair environment (issue 10): one concept per module.

generator.py   templated functions x bug families -> candidate tasks (buggy source, fix, tests)
admission.py   the fail-to-pass gate, run in the sandbox, with rejections counted by reason
grader.py      the oracle: hidden tests in a fresh sandbox the workspace cannot shadow or forge
visible.py     `run_tests`: the visible test file run in the episode's workspace
env.py         one episode: commands, rule and milestone signals, trajectory verification
task.py        the `code_repair` task: splits, prompts, path_signals, SFT demonstrations
curriculum.py  the train pool grown from the tasks RL fails (WebRL): variants through the gate
"""
