"""The wheel: everything installs from suffixspec/ (the folder tree is the package tree); its only top-level name is
suffixspec, and it holds the product only (no training tools, no notes with a machine's paths).

The wheel is built offline from a clean copy of the source (a stale build/ folder must not leak old
files into it), installed with --no-deps into a fresh virtual environment that sees the current
environment's dependencies, and used from a folder outside the checkout.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import urllib.request
from pathlib import Path

import pytest
from tiny import start_server_process

ROOT = Path(__file__).resolve().parents[1]


def test_a_checkout_resolves_the_product_through_its_editable_install_and_nothing_else():
    """From the repository root (on sys.path first, as ``python -m`` puts it): every sub-package resolves to
    its own folder under suffixspec/ (the folder tree is the package tree), and no other folder of the
    repository is a part of ``suffixspec``, as in the wheel."""
    check = ("import importlib, pathlib, suffixspec\n"
             "for n in ('index', 'tokenizer_bridge', 'bench', 'web'):\n"
             "    m = importlib.import_module('suffixspec.' + n)\n"
             "    print(n, pathlib.Path(m.__file__).parent.relative_to(pathlib.Path.cwd()).as_posix())\n"
             "for n in ('tests', 'examples', 'tools', 'setup', 'docs'):\n"
             "    try:\n"
             "        importlib.import_module('suffixspec.' + n)\n"
             "        print(n, 'imported')\n"
             "    except ModuleNotFoundError:\n"
             "        print(n, 'absent')\n")
    out = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:-1] == ["index suffixspec/index",
                                           "tokenizer_bridge suffixspec/tokenizer_bridge", "bench suffixspec/bench",
                                           "web suffixspec/web", "tests absent", "examples absent", "tools absent",
                                           "setup absent", "docs absent"], out.stdout


MACHINE_PATH = re.compile(r"(?<![\w.~])/(?:root|work|tmp|home|srv|mnt|Users)/")


def check_wheel_contents(wheel: Path) -> None:
    """The wheel holds the product: one top-level name, no training lab, no notes with a machine's paths."""
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if ".dist-info/" not in n]
        assert {n.split("/")[0] for n in names} == {"suffixspec"}, sorted({n.split("/")[0] for n in names})
        assert not [n for n in names if "/training/" in n or "/tools/" in n or "shallow_draft" in n]
        assert "suffixspec/core/exact_attention.c" in names  # compiled where it runs (core/exact_attention.py)
        notes = [n for n in names if n.endswith(".md")]
        assert notes and all(n.startswith("suffixspec/default_models/") for n in notes), notes  # the model cards
        local = [n for n in notes if MACHINE_PATH.search(z.read(n).decode())]
        assert not local, local


def _copy_source(dst: Path) -> Path:
    skip = {".git", ".venv", ".ci", "build", "dist", "tests", "results", "__pycache__", ".pytest_cache",
            ".ruff_cache", "artifacts"}
    shutil.copytree(ROOT, dst, ignore=lambda d, names: [n for n in names if n in skip or n.endswith(
        (".egg-info", ".db", ".db-wal", ".db-shm", ".pyc"))])
    return dst


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("setuptools.command.bdist_wheel") is None,
                    reason="building the wheel offline needs setuptools>=70.1 (pip install -e '.[dev]')")
def test_wheel_installs_one_top_level_package_suffixspec(tmp_path, tiny_model_dirs):
    src = _copy_source(tmp_path / "src")
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(dist), str(src)], check=True, capture_output=True, timeout=300)
    wheel = next(dist.glob("suffixspec-*.whl"))
    check_wheel_contents(wheel)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True, timeout=120)
    vpy = venv / "bin" / "python"
    purelib = subprocess.run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # The dependencies of this environment (when it is itself a venv, and any it extends through a .pth
    # line): paths only, so its editable install of the checkout (a .pth hook in that folder) is not loaded.
    deps = [sysconfig.get_paths()["purelib"], *(p for p in sys.path if p.endswith("site-packages"))]
    Path(purelib, "zz_deps.pth").write_text("".join(f"{p}\n" for p in dict.fromkeys(deps)))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(vpy), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, capture_output=True, timeout=300)
    top = sorted(p.name for p in Path(purelib).iterdir() if not p.name.endswith((".dist-info", ".pth")))
    assert top == ["suffixspec"], top

    work = tmp_path / "elsewhere"  # not the checkout: nothing of it on sys.path
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", SUFFIXSPEC_DB=str(tmp_path / "w.db"))
    check = ("import importlib.util as u, suffixspec, suffixspec.bench.run, suffixspec.bench.workloads.sources as w\n"
             "import suffixspec.index.store, suffixspec.index.writer as wr, suffixspec.tokenizer_bridge\n"
             "print(suffixspec.__file__, *(u.find_spec(n) for n in ('bench', 'web', 'index', 'tokenizer_bridge')),\n"
             "      len(w.code_files()) > 0, wr._ROOT, u.find_spec('suffixspec.tests'))\n")  # code-edit sources
    out = subprocess.run([vpy, "-c", check], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(Path(purelib, "suffixspec", "__init__.py")), "None", "None", "None", "None",
                                  "True", purelib, "None"]

    cli = str(venv / "bin" / "suffixspec")
    out = subprocess.run([cli, "bench", "--help"], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Examples:" in out.stdout, out.stderr
    out = subprocess.run([cli, "bench", "--workloads", "nope"], cwd=work, env=env, capture_output=True, text=True,
                         timeout=120)  # imports the benchmark package from the wheel, then rejects the name
    assert out.returncode == 2 and "unknown workload" in out.stderr, out.stderr

    proc, url = start_server_process([cli, "serve", "--model", str(tiny_model_dirs["llama"]), "--draft-model",
                                      "none", "--port", "0"], work, env)
    try:
        with urllib.request.urlopen(url + "/", timeout=30) as r:
            page = r.read().decode()
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
        assert "<title>" in page
        for asset in re.findall(r'(?:src|href)="/?(?:static/)?([\w.-]+\.(?:js|css|svg))"', page):
            with urllib.request.urlopen(f"{url}/{asset}", timeout=30) as r:
                assert r.status == 200 and r.read(), asset
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
