"""temper's tasks as environments of other frameworks (issue 31, item 6): the way out, where
`temper.envs.adapters` is the way in.

- `gymnasium_env.TaskGymEnv`: any task's episodes as a `gymnasium.Env` with `Text` spaces,
  registered as `temper/TaskEnv-v0` (`pip install 'temper[envs]'`).
- `openenv_server.TaskEnvironment`: an OpenEnv `Environment` serving them, one temper env per
  session; `serve(task, port=...)` runs it with uvicorn (`pip install 'temper[openenv]'`).
- `episode.TaskEpisodes`: what both share (the problem pool, the observation text, the reward,
  the ends, `info`, user-code guards); it imports neither framework.

A package of its own above the catalog (it builds tasks by name), importing nothing above it;
each module imports its own framework, so importing one never needs the other, and `import temper`
imports none of them.
"""
