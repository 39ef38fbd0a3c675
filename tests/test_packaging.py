"""The wheel carries everything the C++ kernels need: built from this tree, installed in a fresh
virtual environment (torch and the rest from the system site-packages), the kernels compile and
load there, in an empty build cache. A missing header in the package data used to make a wheel
install fall back to the slow path without a word.

That one build is also the AVX-512 test build where SIMDe is installed (TOKENMILL_EMULATE_AVX512=1,
kernels/csrc/avx512_intrinsics.h): the AVX-512 F/BF16/VNNI kernels run on emulated intrinsics, so
the kernel tests' avx512 and avx512_bf16 cases run on every CPU, AVX2-only ones included (one
build of about a minute serves both checks)."""
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


# the kernel tests whose cases run per ISA level (under emulation every level runs), and the bf16 model
# tests, which take the avx512_bf16 paths end to end there
ISA_TESTS = ["tests/test_cpu_isa.py", "tests/test_quant_blocks.py", "tests/test_cpu_kernels.py",
             "tests/test_batch_invariance.py", "tests/test_models_reference.py::test_bfloat16_close_to_float32",
             "tests/test_engine_batching.py::test_bfloat16_chunking_and_preemption_outputs_identical",
             "tests/test_models_breadth.py::test_bfloat16_close_to_float32_and_decodes"]


def _emulation_available() -> bool:
    try:
        import simde_py  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> tuple[Path, dict[str, str], Path]:
    """(python, env, folder): the wheel installed in a new venv, with an empty kernel build cache."""
    tmp = tmp_path_factory.mktemp("installed")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "-q", str(wheel)], check=True)
    env = dict(os.environ, PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
               TORCH_EXTENSIONS_DIR=str(tmp / "torch_extensions"), TOKENMILL_CPU_KERNELS="1",
               TOKENMILL_EMULATE_AVX512="1" if _emulation_available() else "0")
    env.pop("PYTHONPATH", None)
    env.pop("TOKENMILL_CPU_ISA", None)
    return py, env, tmp


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler: the kernels cannot build here")
def test_kernels_build_and_load_from_an_installed_wheel(installed):
    py, env, tmp = installed
    run = subprocess.run([str(py), "-c", CHECK], cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler: the kernels cannot build here")
@pytest.mark.skipif(not _emulation_available(), reason="SIMDe headers not installed (pip install simde-py)")
def test_avx512_kernels_pass_the_kernel_tests_on_emulated_intrinsics(installed):
    """The AVX-512 paths' logic on a CPU without AVX-512: the emulated build claims AVX-512
    F/BW/VL/BF16/VNNI, so the kernel tests' avx512 and avx512_bf16 cases run instead of skipping,
    against the same references and tolerances as on real AVX-512 hardware."""
    py, env, tmp = installed
    args = ["-v", "-p", "no:cacheprovider", "-rs", *(str(REPO / t) for t in ISA_TESTS)]
    code = ("import sys, pytest, tokenmill; from tokenmill.kernels import cpu_ops; "
            "assert 'site-packages' in tokenmill.__file__, tokenmill.__file__; "
            f"print('kernels:', cpu_ops.isa()); sys.exit(pytest.main({args!r}))")
    run = subprocess.run([str(py), "-c", code], cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    assert "emulated=simde" in out  # the run used the emulated build, from the installed wheel
    passed = [line for line in out.splitlines() if " PASSED" in line]
    assert sum("avx512" in line for line in passed) >= 20, out[-3000:]  # per-level cases: 26 when written
    assert "cannot run avx512" not in out and "has no AVX512_BF16" not in out
