"""The package as a user installs it: a wheel built from the sources, installed in a fresh venv
without the dev extras. `import temper`, `temper --help` and a dry run of the default recipe work,
and none of them needs a dev-only package (TRL, TensorBoard, gymnasium, MCP, OpenEnv, reasoning-gym):
those are blocked in that venv, so a module that imported one at load time fails here.

Offline: the wheel is built without build isolation (setuptools from this venv), installed with
--no-deps, and the runtime dependencies (torch, transformers, ...) are read from this venv's
site-packages through a path file, not downloaded."""

import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DEV_ONLY = ("trl", "tensorboard", "gymnasium", "mcp", "openenv", "reasoning_gym", "pytest", "ruff")

BLOCKER = f'''
import sys
BLOCKED = {DEV_ONLY!r}
class _Blocked:
    """Dev extras are not installed here: importing one is the failure this venv exists to show."""
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (a dev extra, not installed)")
        return None
sys.meta_path.insert(0, _Blocked())
'''


CLEAN = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
"""This environment without what would put the checkout's sources (or another venv) first."""


def _sh(*cmd, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, env=CLEAN, **kw)
    assert out.returncode == 0, f"{cmd}: exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    tree = tmp / "tree"  # a copy, so the build leaves no build/ or egg-info in the checkout
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (tree / name).write_bytes((ROOT / name).read_bytes())
    _sh("cp", "-r", ROOT / "src", tree / "src")
    _sh("find", tree / "src", "-name", "__pycache__", "-prune", "-exec", "rm", "-rf", "{}", "+")
    dist = tmp / "dist"
    _sh(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-w",
        dist,
        tree,
    )
    (wheel,) = dist.glob("temper-*.whl")
    venv = tmp / "venv"
    _sh(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    _sh(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel)
    site = Path(_sh(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip())
    # the runtime dependencies from this venv (a path line: its own .pth files, e.g. the editable
    # install of the checkout, are not run), with the dev extras blocked
    (site / "zz_runtime_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    (site / "_block_dev_extras.py").write_text(BLOCKER)
    (site / "_block_dev_extras.pth").write_text("import _block_dev_extras\n")
    return wheel, venv


def test_the_wheel_holds_the_package_and_no_dev_dependency(installed):
    wheel, _ = installed
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = next(z.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    assert (
        "temper/cli.py" in names
        and "temper/py.typed" in names
        and not any(n.startswith("tests/") for n in names)
    )
    requires = [
        line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")
    ]
    unconditional = [r for r in requires if "extra ==" not in r]
    names_of = [re.match(r"[A-Za-z0-9_.-]+", r).group().lower().replace("-", "_") for r in unconditional]
    dev = [n for n in names_of if n in DEV_ONLY or n.startswith("openenv")]
    assert unconditional and not dev, unconditional
    assert any('extra == "vllm"' in r for r in requires) and any('extra == "dev"' in r for r in requires)


def test_import_help_and_a_dry_run_need_no_dev_extra(installed):
    _, venv = installed
    python, temper = venv / "bin" / "python", venv / "bin" / "temper"
    where = _sh(
        python, "-c", "import temper, temper.cli; print(temper.__version__, temper.__file__)"
    ).stdout.split()
    assert where[0] == "0.1.0" and where[1].startswith(str(venv)), where  # the wheel's copy, not the checkout
    assert "run" in _sh(temper, "--help").stdout
    blocked = subprocess.run([python, "-c", "import trl"], capture_output=True, text=True, env=CLEAN)
    assert blocked.returncode != 0 and "dev extra" in blocked.stderr  # the blocker is in force
    plan = _sh(temper, "run", ROOT / "recipes" / "quickstart.yaml", "--dry-run", cwd=venv)
    assert "4. eval" in plan.stdout + plan.stderr
