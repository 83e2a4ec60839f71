"""``scripts/setup_env.sh`` and ``scripts/test.sh`` on a GPU box, without installing anything.

The defects these pin (issue 23): the test command re-ran the CPU set-up over a GPU install
(CPU torch 2.13 over CUDA torch 2.11), the set-up fell back to any ``python3`` although the
project needs 3.11, it started a GPU install on a driver too old for CUDA 13, and the CPU suite
ran GPU paths when a GPU was visible.

Every run here is hermetic: PATH holds only a few coreutils plus fake ``python*`` and
``nvidia-smi`` scripts, VENV is a temporary folder, and the checks use the set-up's dry run
(``SETUP_ENV_DRY_RUN=1``: checks, prints ``mode=M python=P``, exits before creating or installing
anything). A fake interpreter records a ``-m venv`` call, so "nothing was created" is checked too.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "scripts" / "setup_env.sh"
TEST_SH = ROOT / "scripts" / "test.sh"
BASH = shutil.which("bash")
TOOLS = ("dirname", "head", "tr", "cat", "sha256sum", "cut", "sed")  # what the scripts call besides builtins
SEE_GPU_ENV = "CACHE_POLICY_TESTS_SEE_GPU"


def write_script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{BASH}\n{body}")
    path.chmod(0o755)
    return path


def fake_python(path: Path, identity: str) -> Path:
    """An interpreter that answers the set-up's ``-c`` probe with ``identity`` (e.g. ``CPython
    3.12.3``) and records ``-m venv`` in ``<path>.venv-called`` instead of making a venv."""
    version = identity.split()[-1]
    return write_script(path, f"""\
case "$1" in
  --version) echo "Python {version}" ;;
  -c) echo "{identity}" ;;
  -m) echo "$*" >"{path}.venv-called" ;;
  *) exit 1 ;;
esac
""")


def fake_nvidia_smi(bin_dir: Path, driver: str = "", fail: str = "") -> Path:
    """``nvidia-smi`` answering the driver query for two GPUs, or failing as it does without a driver."""
    if fail:
        body = f'echo "{fail}"\nexit 9\n'
    else:
        body = f"""\
[ "$*" = "--query-gpu=driver_version --format=csv,noheader" ] || {{ echo "unexpected: $*"; exit 3; }}
echo "{driver}"
echo "{driver}"
"""
    return write_script(bin_dir / "nvidia-smi", body)


def fake_nvcc(home: Path, release: str = "13.0") -> Path:
    """A CUDA toolkit folder whose ``bin/nvcc --version`` says ``release``, as NVIDIA's does."""
    return write_script(home / "bin" / "nvcc", f"""\
[ "$1" = --version ] || exit 3
echo "nvcc: NVIDIA (R) Cuda compiler driver"
echo "Cuda compilation tools, release {release}, V{release}.48"
""")


@pytest.fixture
def box(tmp_path):
    """A bare machine: bin/ with the coreutils the scripts need and nothing else; venv/ is VENV;
    cuda/ a CUDA 13.0 toolkit that ``run_setup`` names in CUDA_HOME unless told otherwise."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    fake_nvcc(tmp_path / "cuda")
    return tmp_path


def run_setup(box: Path, dry_run: bool = True, **env: str | None) -> subprocess.CompletedProcess:
    """The set-up on ``box``; an ``env`` value of None leaves that variable out."""
    full = {"PATH": str(box / "bin"), "HOME": str(box), "VENV": str(box / "venv"), "CUDA_HOME": str(box / "cuda"),
            **({"SETUP_ENV_DRY_RUN": "1"} if dry_run else {}), **env}
    full = {key: value for key, value in full.items() if value is not None}
    return subprocess.run([BASH, str(SETUP)], env=full, capture_output=True, text=True, timeout=60)


def venv_with(box: Path, identity: str, stamp: str | None = None) -> Path:
    """An existing venv whose interpreter reports ``identity``, with ``stamp`` as its set-up stamp."""
    python = fake_python(box / "venv" / "bin" / "python", identity)
    if stamp is not None:
        (box / "venv" / ".cache-policy-setup").write_text(stamp + "\n")
    return python


def dry_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


# ---------------------------------------------------------------- the Python check


def test_a_python_312_is_refused_before_anything_is_created(box):
    python = fake_python(box / "py312", "CPython 3.12.3")
    result = run_setup(box, dry_run=False, PYTHON=str(python))
    assert result.returncode == 2
    assert f"{python} (PYTHON={python}) is CPython 3.12.3, but this project needs CPython 3.11" in result.stderr
    assert "set PYTHON=/path/to/python3.11" in result.stderr
    assert not Path(f"{python}.venv-called").exists() and not (box / "venv").exists()


def test_python3_is_used_only_when_it_is_311(box):
    fake_python(box / "bin" / "python3", "CPython 3.12.3")
    result = run_setup(box)
    assert result.returncode == 2
    assert "python3 (python3 on PATH (no python3.11)) is CPython 3.12.3" in result.stderr

    fake_python(box / "bin" / "python3", "CPython 3.11.9")
    assert dry_line(run_setup(box)) == "mode=cpu python=python3"


def test_python311_is_preferred_and_PYTHON_overrides(box):
    fake_python(box / "bin" / "python3", "CPython 3.11.2")
    fake_python(box / "bin" / "python3.11", "CPython 3.11.9")
    assert dry_line(run_setup(box)) == "mode=cpu python=python3.11"
    other = fake_python(box / "opt" / "python", "CPython 3.11.4")
    assert dry_line(run_setup(box, PYTHON=str(other))) == f"mode=cpu python={other}"


@pytest.mark.parametrize("identity", ["PyPy 3.11.13", "CPython 3.10.14", "CPython 3.1.1"])
def test_other_implementations_and_versions_are_refused(box, identity):
    result = run_setup(box, PYTHON=str(fake_python(box / "py", identity)))
    assert result.returncode == 2 and f"is {identity}, but this project needs CPython 3.11" in result.stderr


def test_the_probe_works_on_a_real_interpreter(box):
    """The fakes answer whatever ``-c`` asks; this runs the set-up's real probe on this 3.11."""
    assert sys.version_info[:2] == (3, 11), "the project's venv is 3.11"
    assert dry_line(run_setup(box, PYTHON=sys.executable)) == f"mode=cpu python={sys.executable}"


def test_missing_interpreters_say_how_to_fix(box):
    result = run_setup(box)
    assert result.returncode == 2 and "no python3.11 or python3 on PATH" in result.stderr
    result = run_setup(box, PYTHON=str(box / "nowhere" / "python"))
    assert result.returncode == 2 and "no such interpreter" in result.stderr


def test_an_existing_venv_with_another_python_is_named(box):
    venv_with(box, "CPython 3.12.3", stamp="cpu abc")
    fake_python(box / "bin" / "python3.11", "CPython 3.11.9")  # a right base does not help
    result = run_setup(box)
    assert result.returncode == 2
    assert f"{box / 'venv'} was made with CPython 3.12.3" in result.stderr
    assert f"rm -rf {box / 'venv'}" in result.stderr


def test_an_existing_311_venv_needs_no_base_interpreter(box):
    python = venv_with(box, "CPython 3.11.9", stamp="cpu abc")
    assert dry_line(run_setup(box)) == f"mode=cpu python={python}"


# ---------------------------------------------------------------- the sticky mode


@pytest.mark.parametrize("stamp, gpu, mode, why", [
    ("gpu 0123", None, "gpu", "was installed in gpu mode"),  # scripts/test.sh on a GPU install
    ("gpu installing", None, "gpu", "was installed in gpu mode"),  # an interrupted GPU install
    ("gpu 0123", "0", "cpu", "GPU=0"),
    ("cpu 0123", "1", "gpu", "GPU=1"),
    ("cpu 0123", None, "cpu", "was installed in cpu mode"),
    (None, None, "cpu", "no earlier install"),
    ("", None, "cpu", "no earlier install"),  # an empty stamp
])
def test_the_mode_is_the_venvs_unless_GPU_says_otherwise(box, stamp, gpu, mode, why):
    python = venv_with(box, "CPython 3.11.9", stamp=stamp)
    fake_nvidia_smi(box / "bin", driver="580.65.06")
    result = run_setup(box, **({} if gpu is None else {"GPU": gpu}))
    assert dry_line(result) == f"mode={mode} python={python}"
    assert f"[setup] mode: {mode} (" in result.stdout and why in result.stdout


@pytest.mark.parametrize("setting", [{"GPU": "yes"}, {"GPU": "2"}, {"SETUP_ENV_DRY_RUN": "maybe"}])
def test_bad_settings_exit_2(box, setting):
    venv_with(box, "CPython 3.11.9")
    result = run_setup(box, **setting)
    name, value = next(iter(setting.items()))
    assert result.returncode == 2 and f"{name}={value}: expected" in result.stderr


# ---------------------------------------------------------------- the driver preflight


def test_gpu_mode_needs_nvidia_smi(box):
    venv_with(box, "CPython 3.11.9")
    result = run_setup(box, GPU="1")
    assert result.returncode == 2
    assert "needs an NVIDIA driver >= 580" in result.stderr and "nvidia-smi is not on PATH" in result.stderr


def test_a_driver_too_old_for_cuda_13_is_refused(box):
    venv_with(box, "CPython 3.11.9", stamp="gpu 0123")
    fake_nvidia_smi(box / "bin", driver="575.57.08")
    result = run_setup(box, dry_run=False)  # sticky GPU mode: the check runs on every test.sh too
    assert result.returncode == 2
    assert "NVIDIA driver 575.57.08 is too old" in result.stderr and "driver >= 580" in result.stderr
    assert (box / "venv" / ".cache-policy-setup").read_text() == "gpu 0123\n"  # nothing touched


@pytest.mark.parametrize("driver", ["580.65.06", "590.12", "1000.1.2"])
def test_a_new_enough_driver_passes(box, driver):
    python = venv_with(box, "CPython 3.11.9")
    fake_nvidia_smi(box / "bin", driver=driver)
    result = run_setup(box, GPU="1")
    assert dry_line(result) == f"mode=gpu python={python}"
    assert f"NVIDIA driver {driver} (>= 580" in result.stdout


def test_long_tool_output_is_read_without_a_broken_pipe(box):
    """CI-box flake, exit 141: `echo "$SMI_OUT" | head -n 1` under pipefail SIGPIPEd the writer when
    head exited between its writes (load-dependent). Output far past a pipe's 64 KiB buffer makes
    any such early-exiting reader fail every time, so this fails on the old script deterministically."""
    python = venv_with(box, "CPython 3.11.9")
    write_script(box / "bin" / "nvidia-smi", 'for i in $(seq 20000); do echo "590.12"; done\n')
    (box / "bin" / "seq").symlink_to(shutil.which("seq"))
    write_script(box / "cuda" / "bin" / "nvcc", """\
echo "Cuda compilation tools, release 13.0, V13.0.48"
for i in $(seq 20000); do echo "Cuda compilation tools, release 13.0, V13.0.48"; done
""")
    result = run_setup(box, GPU="1")
    assert dry_line(result) == f"mode=gpu python={python}"
    assert "NVIDIA driver 590.12 (>= 580" in result.stdout


def test_a_failing_or_unreadable_nvidia_smi_is_refused(box):
    venv_with(box, "CPython 3.11.9")
    fake_nvidia_smi(box / "bin", fail="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    result = run_setup(box, GPU="1")
    assert result.returncode == 2 and "couldn't communicate with the NVIDIA driver" in result.stderr
    fake_nvidia_smi(box / "bin", driver="No devices were found")
    result = run_setup(box, GPU="1")
    assert result.returncode == 2 and "could not read a driver version" in result.stderr


def test_cpu_mode_never_asks_the_driver(box):
    python = venv_with(box, "CPython 3.11.9")
    fake_nvidia_smi(box / "bin", fail="must not be called")
    assert dry_line(run_setup(box, GPU="0")) == f"mode=cpu python={python}"


# ---------------------------------------------------------------- the CUDA toolkit (SGLang's JIT kernels)


def test_a_gpu_install_without_a_cuda_toolkit_stops_and_says_what_to_install(box):
    venv_with(box, "CPython 3.11.9")
    fake_nvidia_smi(box / "bin", driver="580.65.06")
    empty = box / "no-toolkit"  # not /usr/local/cuda: the machine running the test may have one
    empty.mkdir()
    result = run_setup(box, GPU="1", CUDA_HOME=str(empty))
    assert result.returncode == 2
    assert (f"no CUDA toolkit: no working nvcc at {empty}/bin/nvcc ($CUDA_HOME/$CUDA_PATH); SGLang "
            "compiles its JIT kernels with it: install NVIDIA's CUDA Toolkit 13") in result.stderr
    assert "export CUDA_HOME=/usr/local/cuda-13.0" in result.stderr


def test_a_toolkit_of_another_major_version_than_torchs_is_refused(box):
    venv_with(box, "CPython 3.11.9")
    fake_nvidia_smi(box / "bin", driver="580.65.06")
    fake_nvcc(box / "cuda12", release="12.4")
    result = run_setup(box, GPU="1", CUDA_HOME=str(box / "cuda12"))
    assert result.returncode == 2
    assert f"the CUDA toolkit at {box / 'cuda12'} ($CUDA_HOME/$CUDA_PATH) is 12.4, torch is built with CUDA 13.0" in result.stderr


@pytest.mark.parametrize("where", ["CUDA_HOME", "CUDA_PATH", "nvcc on PATH"])
def test_the_toolkit_is_found_where_tvm_ffi_looks(box, where):
    python = venv_with(box, "CPython 3.11.9")
    fake_nvidia_smi(box / "bin", driver="580.65.06")
    home = box / "toolkit"
    fake_nvcc(home, release="13.1")
    env = {"CUDA_HOME": None}
    if where == "nvcc on PATH":
        env["PATH"] = f"{home / 'bin'}:{box / 'bin'}"
    else:
        env[where] = str(home)
    result = run_setup(box, GPU="1", **env)
    assert dry_line(result) == f"mode=gpu python={python}"
    assert f"[setup] CUDA toolkit 13.1 at {home} (" in result.stdout


def test_the_sticky_gpu_mode_of_the_test_command_only_warns_without_a_toolkit(box):
    """scripts/test.sh runs the CPU suite, which compiles nothing: a missing toolkit is said, not fatal."""
    python = venv_with(box, "CPython 3.11.9", stamp="gpu 0123")
    fake_nvidia_smi(box / "bin", driver="580.65.06")
    result = run_setup(box, CUDA_HOME=str(box / "venv"))  # a folder without bin/nvcc
    assert dry_line(result) == f"mode=gpu python={python}"
    assert "[setup] warning: no CUDA toolkit" in result.stderr and "a server on the GPU does" in result.stderr


# ---------------------------------------------------------------- the CPU suite hides GPUs


def test_the_suite_runs_with_gpus_hidden():
    """tests/conftest.py set CUDA_VISIBLE_DEVICES="" before torch was imported."""
    if os.environ.get(SEE_GPU_ENV) == "1":
        pytest.skip(f"{SEE_GPU_ENV}=1: the suite sees GPUs on purpose")
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == ""
    if importlib.util.find_spec("torch") is not None:
        import torch

        assert not torch.cuda.is_available()


def child_env(**env: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", SEE_GPU_ENV)}
    return {**base, **env}


def test_pytest_run_directly_hides_a_gpu_the_user_has_set():
    """setdefault would keep a GPU user's CUDA_VISIBLE_DEVICES=0; the conftest overrides it."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"{Path(__file__).relative_to(ROOT)}::test_the_suite_runs_with_gpus_hidden"],
        cwd=ROOT, env=child_env(CUDA_VISIBLE_DEVICES="0"), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("opt_out, seen", [(None, "''"), ("1", "'0'")])
def test_the_conftest_hides_gpus_at_import_unless_opted_out(opt_out, seen):
    env = child_env(CUDA_VISIBLE_DEVICES="0", **({} if opt_out is None else {SEE_GPU_ENV: opt_out}))
    result = subprocess.run(
        [sys.executable, "-c", "import os, tests.conftest; print(repr(os.environ.get('CUDA_VISIBLE_DEVICES')))"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == seen


@pytest.mark.parametrize("opt_out, seen", [(None, "[] set"), ("1", "[0] set")])
def test_test_sh_hides_gpus_from_pytest(tmp_path, opt_out, seen):
    """scripts/test.sh, copied into a root whose set-up and venv python are stand-ins."""
    root = tmp_path / "root"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(TEST_SH, root / "scripts" / "test.sh")
    write_script(root / "scripts" / "setup_env.sh", "exit 0\n")
    write_script(root / ".venv" / "bin" / "python", 'echo "[$CUDA_VISIBLE_DEVICES] ${CUDA_VISIBLE_DEVICES+set} $*"\n')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dirname").symlink_to(shutil.which("dirname"))
    env = {"PATH": str(bin_dir), "CUDA_VISIBLE_DEVICES": "0", **({} if opt_out is None else {SEE_GPU_ENV: opt_out})}
    result = subprocess.run([BASH, str(root / "scripts" / "test.sh"), "--fast"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{seen} -m pytest -q -p no:cacheprovider --durations=25 tests/unit tests/reference"
