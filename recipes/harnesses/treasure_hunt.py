"""A harness for the treasure_hunt task (`temper.harness.file` describes the interface).

The environment's observation is the treasure's offset (`d2 r1`) over the 3x3 view around the
agent (`@`). The knobs say what of it the model reads and what is added around it:
- system: a system turn describing the agent's role, or none;
- preamble: the game's rules before the first observation, or none;
- fields: which observation fields are shown (the offset line, the view, or both);
- memory: a state line carried between turns (the last move, or every move so far), or none;
- bootstrap: a pre-run description of the environment put before the first prompt (the map's
  side and the move limit, read from the task's options before the episode starts), or none.
SETTINGS is a generic agent harness: rules, a role and a history of moves, as one would write
for a large model; `harness_search` looks for better values for the frozen model at hand.
"""

KNOBS = {
    "system": ["none", "explorer"],
    "preamble": ["none", "rules"],
    "fields": ["offset+view", "view", "offset"],
    "memory": ["none", "last", "moves"],
    "bootstrap": ["none", "map"],
}
SETTINGS = {
    "system": "explorer",
    "preamble": "rules",
    "fields": "offset+view",
    "memory": "moves",
    "bootstrap": "none",
}

TEMPLATES = {
    "explorer": "You are an explorer on a grid map. Reach the treasure in as few moves as you can.",
    "rules": "Find $. d2 r1: $ is 2 down, 1 right. @ you, # wall, ^ trap. Say up, down, left or right.",
}


def system(settings):
    return TEMPLATES.get(settings["system"], "")


def bootstrap(env, settings):
    if settings["bootstrap"] == "none":
        return ""
    size = env["options"].get("size", 4)
    limit = env["options"].get("max_steps") or 2 * size + 2
    return f"{size}x{size} map, {limit} moves.\n"


def _fields(observation, fields):
    lines = observation.splitlines()
    # the offset line is absent when the agent stands on the treasure's row and column
    has_offset = bool(lines) and not any(ch in lines[0] for ch in "#.@^$")
    offset, view = (lines[:1], lines[1:]) if has_offset else ([], lines)
    return "\n".join({"offset+view": offset + view, "view": view, "offset": offset or view}[fields])


def build_prompt(observation, memory, first, settings):
    head = TEMPLATES["rules"] + "\n" if first and settings["preamble"] == "rules" else ""
    state = ""
    if settings["memory"] == "last" and memory.get("moves"):
        state = f"last: {memory['moves'][-1]}\n"
    elif settings["memory"] == "moves" and memory.get("moves"):
        state = "moves: " + ",".join(memory["moves"]) + "\n"
    return head + state + _fields(observation, settings["fields"])


def update_memory(memory, action, observation, settings):
    return {**memory, "moves": [*memory.get("moves", []), action.strip()[:8]]}
