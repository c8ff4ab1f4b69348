"""The ecosystem's environments as temper `Env`s, unchanged (issue 9, item 8).

- `gymnasium_text.GymTextEnv`: a `gymnasium.Env` played through text (`pip install 'temper[envs]'`).
- `trl_factory.TRLEnvironment`: a TRL `GRPOTrainer(environment_factory=...)` class, its public
  methods as tools called in the model's text.
- `openenv.OpenEnvEnv`: an OpenEnv environment server, through its client
  (`pip install 'temper[openenv]'`).

Each module imports its own ecosystem package, so importing one never needs the others.
"""
