"""The sandbox that untrusted code from the model runs in (tool calls, code interpreters, graders).

`Sandbox(workspace, Limits(...)).run(code)` returns a `RunResult`; `probe()` says which tiers this host
gives (tier A "bwrap": bubblewrap with every namespace, read-only system directories, no capabilities,
rlimits; tier B "landlock", where user namespaces are unavailable: Landlock, seccomp, rlimits, a
subreaper supervisor). Both kill the whole process tree at the wall clock, cap output, cap the
sandbox's total memory (a cgroup where the host allows one, else procs x memory_mb under the host)
and the total size of its workspace and tmp, with limits fitted to the host (`budget.py`); every
result records its tier. A failure of the sandbox itself raises
`SandboxError`; a host with no working tier raises `SandboxUnavailable` unless `unsafe=True`.
"""

from temper.sandbox.probe import SANDBOX_UID, HostProbe, probe
from temper.sandbox.sandbox import (
    Limits,
    RunResult,
    Sandbox,
    SandboxError,
    SandboxUnavailable,
    workspace_root,
)

__all__ = [
    "SANDBOX_UID",
    "HostProbe",
    "Limits",
    "RunResult",
    "Sandbox",
    "SandboxError",
    "SandboxUnavailable",
    "probe",
    "workspace_root",
]
