"""The external section builds Model-Optimizer's CUDA extensions in ``prepare()`` (its own process,
while the cases run), without initialising CUDA, and says in its notes what it compiled or loaded.

On CPU the build is a fake that writes the library into the extensions folder (as a compile
does); the real build, and that it leaves CUDA uninitialised, is the ``gpu`` test at the end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types

import pytest
import torch

from moe_fq_parity.harness import sections
from moe_fq_parity.harness.sections.processes import _prepare
from moe_fq_parity.harness.backends import modelopt_backend as mb
from moe_fq_parity.harness.sections.external import section


@pytest.fixture
def fake_modelopt(monkeypatch, tmp_path):
    """A CUDA torch with one compute-capability-9.0 GPU (as NVML reports it) and Model-Optimizer
    extension getters that 'compile' by writing ``<name>.so`` into the extensions folder."""
    calls: list[tuple[str, str, bool]] = []

    def getter(name):
        def get(raise_if_failed=False):
            calls.append((name, os.environ.get("TORCH_CUDA_ARCH_LIST", ""), torch.cuda.is_initialized()))
            lib = tmp_path / name / f"{name}.so"
            lib.parent.mkdir(exist_ok=True)
            lib.write_bytes(b"built")
            return types.SimpleNamespace(name=name)
        return get

    ext = types.SimpleNamespace(get_cuda_ext=getter("modelopt_cuda_ext"), get_cuda_ext_fp8=getter("modelopt_cuda_ext_fp8"))
    modules = {"modelopt.torch.quantization.extensions": ext, mb._TENSOR_QUANT: types.SimpleNamespace()}
    monkeypatch.setattr(mb, "try_import", lambda name: (modules[name], ""))
    monkeypatch.setattr(mb, "build_folder", lambda name: str(tmp_path / name))
    monkeypatch.setattr(mb, "nvml_arch_list", lambda: "9.0")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)

    def no_cuda_init(*a, **k):
        raise AssertionError("prepare initialised CUDA")

    monkeypatch.setattr(torch.cuda, "_lazy_init", no_cuda_init)
    monkeypatch.setattr(torch.cuda, "get_device_capability", no_cuda_init)
    monkeypatch.setattr(mb, "BUILDS", {})
    monkeypatch.setattr(section, "BUILDS", mb.BUILDS)
    monkeypatch.setattr(section, "PREPARED", [])
    return calls


def test_prepare_builds_both_extensions_once_without_cuda(fake_modelopt, capsys, monkeypatch):
    _prepare(sections.SECTION_RUNNERS["external"])  # the plumbing start_sections runs in the section process
    assert [c[0] for c in fake_modelopt] == ["modelopt_cuda_ext", "modelopt_cuda_ext_fp8"]
    assert all(arch == "9.0" and not initialised for _, arch, initialised in fake_modelopt)
    out = capsys.readouterr().out
    assert out.count("external: compiling Model-Optimizer's CUDA extension") == 2
    assert {k: (b.compiled, b.phase, b.error) for k, b in mb.BUILDS.items()} == {"int": (True, "prepare", ""), "fp8": (True, "prepare", "")}
    # the section's run finds them built: no second build, and the notes say what prepare did
    assert mb._cuda_extension("fp8") == "" and mb._cuda_extension("int") == "" and len(fake_modelopt) == 2
    monkeypatch.setattr(section, "BACKENDS", {})
    notes = section.run("smoke", 0, "cpu").notes
    assert "Model-Optimizer CUDA extensions: modelopt_cuda_ext compiled in " in notes
    assert "modelopt_cuda_ext_fp8 compiled in " in notes and notes.count("(prepare)") == 2


def test_the_next_run_loads_from_the_cache(fake_modelopt, capsys, monkeypatch):
    mb.prepare_extensions()
    capsys.readouterr()
    monkeypatch.setattr(mb, "BUILDS", {})  # a new process, the same extensions folder
    monkeypatch.setattr(section, "BUILDS", mb.BUILDS)
    summary = mb.prepare_extensions()
    assert "compiling" not in capsys.readouterr().out
    assert summary.count("loaded from the cache") == 2, summary


def test_a_user_arch_list_is_kept(fake_modelopt, monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0 9.0")
    mb.prepare_extensions()
    assert {arch for _, arch, _ in fake_modelopt} == {"8.0 9.0"}


def test_a_failed_build_is_kept_for_the_rows(fake_modelopt, monkeypatch):
    def broken(raise_if_failed=False):
        raise RuntimeError("nvcc not found")

    ext, _ = mb.try_import("modelopt.torch.quantization.extensions")
    monkeypatch.setattr(ext, "get_cuda_ext_fp8", broken)
    mb.prepare_extensions()
    assert "nvcc not found" in mb._cuda_extension("fp8") and mb._cuda_extension("int") == ""
    assert "modelopt_cuda_ext_fp8 failed in" in str(mb.BUILDS["fp8"])


def test_nothing_to_build_without_a_gpu(monkeypatch):
    monkeypatch.setattr(mb, "BUILDS", {})
    monkeypatch.setattr(mb, "nvml_arch_list", lambda: "")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(mb, "try_import", lambda name: (types.SimpleNamespace(), ""))
    assert mb.prepare_extensions() == "no GPU visible through NVML: nothing to build" and mb.BUILDS == {}


PREPARE_PROBE = """
import os, subprocess, torch
from moe_fq_parity.harness.sections.external import section
section.prepare()
apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True, text=True).stdout.split()
print("PREPARED", section.PREPARED[-1])
print("INITIALISED", torch.cuda.is_initialized(), str(os.getpid()) in apps)
"""


@pytest.mark.gpu(lease=False)  # minutes of nvcc with no CUDA context: a lease would stall every other GPU test
def test_real_prepare_builds_without_a_cuda_context():
    """On a GPU host with Model-Optimizer: prepare() in a fresh process builds (or loads) both
    extensions, and the process holds no CUDA context on the GPU afterwards (it is not among
    nvidia-smi's compute apps).  torch's own CUDA state may be initialised by the build (it is on an
    H200: ``torch.cuda.is_initialized()`` True): no context, no GPU memory, and the section forks
    nothing, so that is not checked."""
    pytest.importorskip("modelopt.torch.quantization", reason="pip install 'moe-fq-parity[modelopt]'")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    proc = subprocess.run([sys.executable, "-c", PREPARE_PROBE], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(r"^INITIALISED (True|False) False$", proc.stdout, re.M), proc.stdout
    assert "modelopt_cuda_ext " in proc.stdout and "modelopt_cuda_ext_fp8 " in proc.stdout and "failed" not in proc.stdout, proc.stdout
