"""The wheel carries everything the C++ kernels need: built from this tree, installed in a fresh
virtual environment (torch and the rest from the system site-packages), the kernels compile and
load there, in an empty build cache. A missing header in the package data used to make a wheel
install fall back to the slow path without a word."""
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CHECK = """
import sys, tokenmill
from tokenmill.kernels import cpu_ops
assert "site-packages" in tokenmill.__file__, tokenmill.__file__
sys.exit(0 if cpu_ops.load() else 3)
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out)], check=True, cwd=out)
    return next(out.glob("tokenmill-*.whl"))


def test_wheel_holds_every_kernel_source_and_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in ("tokenmill/kernels/csrc", "tokenmill/data", "tokenmill/fleet/dashboard"):
        for path in (REPO / folder).iterdir():
            if path.is_file():
                assert f"{folder}/{path.name}" in names, f"{folder}/{path.name} is not in the wheel"


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler: the kernels cannot build here")
def test_kernels_build_and_load_from_an_installed_wheel(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "-q", str(wheel)], check=True)
    env = dict(os.environ, PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
               TORCH_EXTENSIONS_DIR=str(tmp_path / "torch_extensions"), TOKENMILL_CPU_KERNELS="1")
    env.pop("PYTHONPATH", None)
    run = subprocess.run([str(py), "-c", CHECK], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
