"""Agent RL: episodes as token-exact trajectories (`trajectory.py`) and the loop that runs a batch
of environments in lockstep with one sampler call per turn (`loop.py`)."""
