"""Both install modes give one import root, and a regular install has everything.

The top-level folders sdk/, backends/, native/ and tools/ are reached as kvstored.sdk and
so on through links in kvstored/ (docs/architecture.md), so the checkout, the editable
install and a wheel have one import tree. The editable install's finder also finds what
a wheel would leave out, so the regular install is checked where no such finder exists:
a wheel built from a copy of the tracked sources, installed into a fresh venv, run with
the working directory outside the repository and no ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import kvstored

REPO = Path(__file__).resolve().parents[1]
#: Top-level folders that kvstored/ links to, as the package each installs as.
LINKED = {"sdk": "kvstored.sdk", "backends": "kvstored.backends",
          "native": "kvstored.native", "tools": "kvstored.tools"}
#: Not part of the source tree a wheel is built from.
UNTRACKED = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info",
                                   "__pycache__", "*.so", ".pytest_cache", ".ruff_cache",
                                   ".hypothesis", "bench-results")


def test_each_top_level_folder_is_reached_through_its_link_in_kvstored():
    import kvstored.backends
    import kvstored.native
    import kvstored.sdk
    import kvstored.tools

    assert Path(kvstored.__file__).parent == REPO / "kvstored"
    for folder, name in LINKED.items():
        link = REPO / "kvstored" / folder
        assert link.is_symlink() and os.readlink(link) == f"../{folder}", link
        # Imported through the link, so tools that read the checkout (the type checker,
        # ruff) see the same module path as the interpreter.
        module = sys.modules[name]
        assert Path(module.__file__).parent == link, module.__file__
        assert Path(module.__file__).resolve().parent == REPO / folder


def test_console_scripts_give_useful_help():
    bindir = Path(sys.executable).parent
    for script, expected in (("kvstored", "up"), ("kvstore", "Exit codes")):
        out = subprocess.run([str(bindir / script), "--help"], check=True,
                             capture_output=True, text=True).stdout
        assert expected in out, out
    assert kvstored.__version__


def _copy_sources(target: Path) -> Path:
    """The tree as a fresh clone has it: tracked and new files, no build products (a stale
    build/ or an in-place .so would hide a file the wheel misses)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=REPO, capture_output=True)
    if listed.returncode != 0:  # not a git checkout: copy the folder, minus build products
        shutil.copytree(REPO, target, ignore=UNTRACKED, symlinks=True)
        return target
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_symlink():  # kvstored/sdk and the other links, as links
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(source), target / name)
        elif source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def _source_packages() -> set[str]:
    """Every folder holding Python modules, as the package a wheel must install it as."""
    found = set()
    for folder, subfolders, files in os.walk(REPO / "kvstored", followlinks=True):
        subfolders[:] = [d for d in subfolders if d != "__pycache__"]
        if any(f.endswith(".py") for f in files):
            found.add(".".join(Path(folder).relative_to(REPO).parts))
    return found


def _run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess:
    run = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=timeout)
    assert run.returncode == 0, f"{' '.join(map(str, args))} exited {run.returncode}:\n" \
                                f"{run.stdout}\n{run.stderr}"
    return run


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    """A venv holding only the wheel; its dependencies come from this venv's site-packages,
    added as a plain path (a .pth line), so this venv's editable finder is not loaded."""
    work = tmp_path_factory.mktemp("wheel")
    source = _copy_sources(work / "src")
    dist = work / "dist"
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", dist, source, cwd=work)
    (wheel,) = dist.glob("kvstored-*.whl")
    venv = work / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=work)
    python = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
         "--no-index", wheel, cwd=work)
    purelib = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))",
                        cwd=work).stdout.strip())
    assert purelib.is_relative_to(venv), purelib
    (purelib / "_dependencies_from_the_dev_venv.pth").write_text(
        "\n".join([*site.getsitepackages(), sysconfig.get_path("platlib")]) + "\n")
    return venv


def _clean_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


#: The engine adapters import their engine (which the wheel does not depend on) when
#: the engine loads them; without it installed, only that import may fail.
ENGINE_PACKAGES = {
    "kvstored.integrations.sglang": ("sglang", "torch"),
    "kvstored.integrations.lmcache": ("lmcache", "torch"),
    "kvstored.integrations.vllm": ("vllm", "torch"),
    # The measuring process of `kvstore bench engines`: SGLang's own code, imported at the top.
    "kvstored.bench.engines_peer": ("sglang", "torch"),
}

PROBE = r"""
import importlib, json, pkgutil, sys
import kvstored
failed = {}
for info in pkgutil.walk_packages(kvstored.__path__, "kvstored.",
                                  onerror=lambda name: failed.setdefault(name, "walk")):
    if info.name.rpartition(".")[2] == "__main__":
        continue  # running it is not importing it
    try:
        importlib.import_module(info.name)
    except ModuleNotFoundError as exc:
        failed[info.name] = f"ModuleNotFoundError: {exc}", exc.name
    except BaseException as exc:
        failed[info.name] = f"{type(exc).__name__}: {exc}", None
from importlib.resources import files
print(json.dumps({
    "modules": {n: getattr(m, "__file__", None) for n, m in sys.modules.items()
                if n == "kvstored" or n.startswith("kvstored.")},
    "packages": sorted(n for n, m in sys.modules.items()
                       if n.startswith("kvstored") and hasattr(m, "__path__")),
    "failed": failed,
    "finders": [type(f).__name__ + " " + repr(f) for f in sys.meta_path],
    "models": (files("kvstored.tools") / "data" / "models.toml").is_file(),
}))
"""


@pytest.mark.slow
def test_wheel_in_a_fresh_venv_has_every_package_and_runs(wheel_venv, tmp_path):
    env = _clean_env(wheel_venv)
    site_dir = next((wheel_venv / "lib").glob("python3*/site-packages"))
    top = {p.name for p in site_dir.iterdir()} - {"__pycache__"}
    assert {n for n in top if not n.endswith((".dist-info", ".pth"))} == {"kvstored"}, top

    probe = json.loads(_run(wheel_venv / "bin" / "python", "-c", PROBE, cwd=tmp_path,
                            env=env).stdout)
    failed = {name: why for name, (why, missing) in probe["failed"].items()
              if (missing or "").partition(".")[0] not in ENGINE_PACKAGES.get(name, ())}
    assert not failed, failed
    assert not [f for f in probe["finders"] if "editable" in f.lower()], probe["finders"]
    outside = {n: f for n, f in probe["modules"].items()
               if f is not None and not Path(f).is_relative_to(site_dir)}
    assert not outside, f"imported from outside the venv: {outside}"
    assert Path(probe["modules"]["kvstored"]).parent == site_dir / "kvstored"
    missing = _source_packages() - set(probe["packages"])
    assert not missing, f"packages the wheel lacks: {sorted(missing)}"
    assert probe["models"], "kvstored/tools/data/models.toml is not in the wheel"

    for command, expected in (("kvstore mount --help", "read-only view"),
                              ("kvstore sim --help", "--model"),
                              ("kvstored --help", "up"),
                              ("kvstored up --help", "--dram")):
        script, *args = command.split()
        out = _run(wheel_venv / "bin" / script, *args, cwd=tmp_path, env=env).stdout
        assert expected in out, f"{command}:\n{out}"

    # The data file and the compiled simulator core are used, not only present.
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": i, "input_length": 1024,
                                         "output_length": 1, "hash_ids": [1, 2 + i % 3]})
                             + "\n" for i in range(30)))
    sim = json.loads(_run(wheel_venv / "bin" / "kvstore", "sim", trace, "--model", "glm-5.1",
                          "--json", cwd=tmp_path, env=env).stdout)
    assert sim["engine"] == "c" and sim["model"]["id"] == "glm-5.1", sim
    assert sim["bytesPerToken"] == 109_824 and sim["trace"]["blockEvents"] == 60, sim


@pytest.mark.slow
def test_sdist_holds_what_a_wheel_is_built_from(tmp_path):
    """An sdist carries the C sources and data files that the wheel build needs."""
    source = _copy_sources(tmp_path / "src")
    sdist_dir = tmp_path / "sdist"
    _run(sys.executable, "-c", "import sys; from setuptools import build_meta; "
         "build_meta.build_sdist(sys.argv[1])", sdist_dir, cwd=source)
    (sdist,) = sdist_dir.glob("kvstored-*.tar.gz")
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", dist, sdist, cwd=tmp_path)
    import zipfile

    (wheel,) = dist.glob("kvstored-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("kvstored/fuse/__init__.py", "kvstored/tools/data/models.toml",
                   "kvstored/py.typed"):
        assert needed in names, needed
    assert any(n.startswith("kvstored/native/_io") and n.endswith(".so") for n in names)
    assert any(n.startswith("kvstored/native/_batch") and n.endswith(".so") for n in names)
    assert any(n.startswith("kvstored/_copy") and n.endswith(".so") for n in names)
    assert any(n.startswith("kvstored/sdk/_record_check") and n.endswith(".so") for n in names)
    assert any(n.startswith("kvstored/tools/_simcore") and n.endswith(".so") for n in names)
    assert not [n for n in names if n.endswith((".c", ".h"))], "C sources in the wheel"


def test_the_makefiles_editable_install_prints_nothing(tmp_path):
    """`make setup`'s pip line (run here with --no-deps --no-build-isolation, into a venv
    of its own) prints no setuptools warnings: a quiet install that says nothing unless
    something is wrong."""
    recipe = _run("make", "-s", "-B", "-n", ".venv/.installed", cwd=REPO).stdout
    (line,) = [row for row in recipe.splitlines() if "pip install -q -e" in row]
    words = shlex.split(line)
    assignments = dict(w.split("=", 1) for w in words[:words.index("-m") - 1])
    source = _copy_sources(tmp_path / "src")
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    purelib = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))",
                        cwd=tmp_path).stdout.strip())
    # pip, setuptools and cffi from this venv (no index needed), after the install's own.
    (purelib / "zz_build_tools_from_the_dev_venv.pth").write_text(
        "\n".join([*site.getsitepackages(), sysconfig.get_path("platlib")]) + "\n")
    run = _run(python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
               "-e", source, cwd=tmp_path, env={**_clean_env(venv), **assignments})
    assert run.stdout + run.stderr == "", run.stdout + run.stderr
