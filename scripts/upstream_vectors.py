"""Generate the committed upstream vectors (``reference/data/upstream/*.npz``) by running upstream code.

For every rule of ``harness.sections.external.upstreams.RULES`` judged by ``vectors``, this runs the
upstream's own code on the adversarial classes of ``cases.upstream_blocks`` and writes the outputs,
the inputs and each rule's provenance (project, commit, files, call, torch version, device, date and
this command) into one file per format and tile.  Nothing of the upstreams is copied into the
package: their code is loaded from source trees given on the command line, here, at generation time.

    python scripts/upstream_vectors.py --te SRC_TE --deepgemm SRC_DG [--deepseek SRC_DS] [--only PROJECTS]

* ``--te``: a Transformer Engine source tree (its ``tests/pytorch/references/``,
  ``transformer_engine/pytorch/custom_recipes/reference_nvfp4.py`` and ``reference_utils.py``,
  ``tests/cpp/test_common.h``); pure torch on the CPU, plus ``nvcc`` (or ``g++`` with the CUDA headers)
  for its MXFP8 host reference.  ``reference_nvfp4.py`` imports three Transformer Engine modules that
  its quantize does not use; they are given empty stand-ins (``_te_stubs``).
* ``--deepgemm``: a DeepGEMM source tree (``deep_gemm/utils/math.py``, pure torch).
* ``--deepseek``: a DeepSeek-V3 source tree (``inference/kernel.py``): its Triton ``act_quant`` runs on a
  CUDA GPU only, so this part runs on a GPU host and adds its outputs to the 1 x 128 file.
* ``--only``: comma-separated ``te``, ``deepgemm``, ``deepseek`` (default: those whose tree is given).
* ``--out``: the folder (default ``reference/data/upstream``).

An existing file is updated: its inputs must equal the classes built now (else every rule of it has to
be generated again, and this refuses with the classes that changed); the other rules' outputs are kept.
"""

from __future__ import annotations

import argparse
import datetime
import enum
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path
from typing import Callable, Optional

import torch

from moe_fq_parity.cases.upstream_blocks import CLASSES, block_classes
from moe_fq_parity.harness.sections.external.upstreams import (
    AMAX_POLICIES, RULES, UpstreamRule, Vectors, output_key, vectors_name,
)

PROJECT_OF = {"Transformer Engine": "te", "DeepGEMM": "deepgemm", "DeepSeek-V3": "deepseek"}


def _load(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _git_commit(src: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:  # noqa: BLE001 - an exported tree has no git metadata: the rule's version says which commit
        return ""


# --- Transformer Engine ---------------------------------------------------------------------------


def _te_stubs(src: Path) -> None:
    """Stand-ins for the Transformer Engine modules ``reference_nvfp4.py`` imports but its quantize does not use."""
    te = types.ModuleType("transformer_engine")
    tp = types.ModuleType("transformer_engine.pytorch")
    cr = types.ModuleType("transformer_engine.pytorch.custom_recipes")
    qt = types.ModuleType("transformer_engine.pytorch.quantized_tensor")
    gemm = types.ModuleType("transformer_engine.pytorch.custom_recipes.gemm")
    gemm.GEMMType = enum.Enum("GEMMType", "FPROP DGRAD WGRAD")
    gemm.MMParams = object

    class Quantizer:  # the base class: only its constructor's usages are read
        def __init__(self, rowwise: bool = True, columnwise: bool = True) -> None:
            self.rowwise_usage, self.columnwise_usage = rowwise, columnwise

    qt.Quantizer, qt.QuantizedTensorStorage = Quantizer, object
    sys.modules.update({"transformer_engine": te, "transformer_engine.pytorch": tp, "transformer_engine.pytorch.custom_recipes": cr,
                        "transformer_engine.pytorch.custom_recipes.gemm": gemm, "transformer_engine.pytorch.quantized_tensor": qt})
    cr.gemm = gemm
    cr.reference_utils = _load(src / "transformer_engine/pytorch/custom_recipes/reference_utils.py",
                               "transformer_engine.pytorch.custom_recipes.reference_utils")


class TE:
    """Transformer Engine's pure-torch references and its compiled MXFP8 host reference."""

    def __init__(self, src: Path, build: Path) -> None:
        sys.path.insert(0, str(src / "tests/pytorch"))
        from references.blockwise_quantizer_reference import BlockwiseQuantizerReference  # type: ignore[import-not-found]

        self.block = BlockwiseQuantizerReference()
        _te_stubs(src)
        self.ref_nvfp4 = _load(src / "transformer_engine/pytorch/custom_recipes/reference_nvfp4.py", "te_reference_nvfp4")
        self.mx_exe = _build_te_mx(src / "tests/cpp/test_common.h", build)

    def fp8_block(self, x: torch.Tensor, tile: tuple[int, int], pow2: bool) -> torch.Tensor:
        r = self.block.quantize(x, torch.float8_e4m3fn, eps=0.0, pow_2_scales=pow2, quant_tile_shape=tile)
        return self.block.ref_dequantize_rowwise(r.data, tile, r.scale, x.dtype)

    def nvfp4_codes(self, x: torch.Tensor, g: Optional[torch.Tensor], tile_x: int, tile_y: int, pow2: bool):
        ref = self.ref_nvfp4.NVFP4QuantizerRef
        amax = None if g is None else g.reshape(1).to(torch.float32)
        codes, scale = ref._quantize_blockwise_reference(x, amax, tile_x, tile_y, pow_2_scales=pow2, eps=0.0)
        return self.ref_nvfp4.cast_from_fp4x2(codes, torch.float32), scale

    def nvfp4(self, x: torch.Tensor, g: torch.Tensor, tile: tuple[int, int]) -> torch.Tensor:
        """Quantize by the reference; dequantize as ``common/cast/nvfp4/dequantize_nvfp4.cuh`` does:
        ``final_scale = static_cast<float>(scale) * amax * factor_inv`` (left to right, fp32;
        ``factor_inv = 1.0f / (6.0f * 448)``), ``out = static_cast<OType>(q * final_scale)``."""
        vals, ds8 = self.nvfp4_codes(x, g, 16, tile[0], False)
        m, n = x.shape
        factor_inv = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(6.0 * 448.0, dtype=torch.float32)
        final = (ds8.to(torch.float32).reshape(m, n // 16, 1) * g.to(torch.float32)) * factor_inv
        return (vals.reshape(m, n // 16, 16) * final).reshape(m, n).to(x.dtype)

    def mxfp4(self, x: torch.Tensor) -> torch.Tensor:
        """MXFP4 of the reference (``pow_2_scales=True``, 1x32), the scale applied as its GEMM does: ``q * 2**e``."""
        vals, dec = self.nvfp4_codes(x, None, 32, 1, True)
        m, n = x.shape
        return (vals.reshape(m, n // 32, 32) * dec.to(torch.float32).reshape(m, n // 32, 1)).reshape(m, n).to(x.dtype)

    def mxfp8(self, x: torch.Tensor, tile: tuple[int, int]) -> torch.Tensor:
        m, n = x.shape
        with tempfile.TemporaryDirectory() as tmp:
            fin, fout = Path(tmp) / "in.bin", Path(tmp) / "out.bin"
            x.contiguous().view(torch.int16).numpy().tofile(fin)
            subprocess.run([str(self.mx_exe), str(m), str(n), str(tile[0]), str(fin), str(fout)], check=True)
            import numpy as np

            return torch.from_numpy(np.fromfile(fout, dtype=np.int16).reshape(m, n)).view(torch.bfloat16)


_MX_MAIN = r"""
// The rowwise loop of tests/cpp/operator/test_cast_mxfp8.cu compute_ref (CAST_ONLY), over tiles of
// TILE_ROWS x 32 (1: TE's 1x32 blocks; 32: one scale per 32x32 tile, as its 2-D kernel takes
// float_to_e8m0(amax_2d * max_norm_rcp)); dequantized q * exp2f(code) as common/util/ptx.cuh exp2f
// (code 255 -> NaN, 0 -> 2^-127).  Input and output: bf16 bits.
static float exp2f_code(fp8e8m0 e) {
  uint32_t b = e == 255 ? 0x7fffffffu : (e == 0 ? 0x00400000u : (uint32_t)e << FP32_MANTISSA_BITS);
  float f; std::memcpy(&f, &b, 4); return f;
}
int main(int argc, char** argv) {
  const size_t rows = std::stoul(argv[1]), cols = std::stoul(argv[2]), tile_rows = std::stoul(argv[3]);
  std::vector<__nv_bfloat16> in(rows * cols), out(rows * cols);
  FILE* f = std::fopen(argv[4], "rb"); if (std::fread(in.data(), 2, in.size(), f) != in.size()) return 2; std::fclose(f);
  const float max_reciprocal = static_cast<float>(1.0 / 448.0);  // Quantized_Limits<fp8e4m3>::max_reciprocal()
  for (size_t i0 = 0; i0 < rows; i0 += tile_rows) {
    for (size_t j0 = 0; j0 < cols; j0 += 32) {
      float block_amax = 0.0f;
      for (size_t i = i0; i < i0 + tile_rows; ++i)
        for (size_t j = j0; j < j0 + 32; ++j) block_amax = std::max(block_amax, std::abs(static_cast<float>(in[i * cols + j])));
      const fp8e8m0 biased_exponent = float_to_e8m0(block_amax * max_reciprocal);
      const float scale_reciprocal = exp2f_rcp(biased_exponent);
      for (size_t i = i0; i < i0 + tile_rows; ++i)
        for (size_t j = j0; j < j0 + 32; ++j) {
          const fp8e4m3 q = static_cast<fp8e4m3>(static_cast<float>(in[i * cols + j]) * scale_reciprocal);
          out[i * cols + j] = __float2bfloat16_rn(static_cast<float>(q) * exp2f_code(biased_exponent));
        }
    }
  }
  f = std::fopen(argv[5], "wb"); std::fwrite(out.data(), 2, out.size(), f); std::fclose(f);
  return 0;
}
"""


def _extract(text: str, signature: str) -> str:
    """The C++ function of ``text`` that starts with ``signature``, up to its closing brace at column 0."""
    start = text.index(signature)
    end = text.index("\n}\n", start) + 3
    return text[start:end]


def _build_te_mx(header: Path, build: Path) -> Path:
    """Compile TE's ``float_to_e8m0`` and ``exp2f_rcp`` (copied verbatim from ``tests/cpp/test_common.h``) with
    the host loop of ``_MX_MAIN``; nvcc if found, else g++ with the CUDA headers."""
    text = header.read_text()
    src = "\n".join([
        "#include <cuda_fp8.h>", "#include <cuda_bf16.h>", "#include <algorithm>", "#include <cmath>", "#include <cstdint>",
        "#include <cstdio>", "#include <cstring>", "#include <string>", "#include <vector>",
        "using fp8e8m0 = uint8_t; using fp8e4m3 = __nv_fp8_e4m3; using fp32 = float;",
        "constexpr uint32_t FP32_MANTISSA_BITS = 23;",
        _extract(text, "inline fp8e8m0 float_to_e8m0(float val)"), _extract(text, "inline float exp2f_rcp(fp8e8m0 biased_exp)"), _MX_MAIN,
    ])
    build.mkdir(parents=True, exist_ok=True)
    cu, exe = build / "te_mxfp8_ref.cu", build / "te_mxfp8_ref"
    cu.write_text(src)
    nvcc = shutil.which("nvcc")
    cmd = [nvcc, "-O1", "-o", str(exe), str(cu)] if nvcc else ["g++", "-O1", "-x", "c++", "-I/usr/local/cuda/include", "-o", str(exe), str(cu)]
    subprocess.run(cmd, check=True)
    return exe


# --- DeepGEMM and DeepSeek-V3 ------------------------------------------------------------------------


class DeepGEMM:
    def __init__(self, src: Path) -> None:
        self.math = _load(src / "deep_gemm/utils/math.py", "deep_gemm_utils_math")

    def fp8_block(self, x: torch.Tensor, tile: tuple[int, int], ue8m0: bool) -> torch.Tensor:
        """Its cast, then its tests' cast back ``x_fp8.float() * sf`` (``tests/test_attention.py``), to the input dtype."""
        m, n = x.shape
        if tile[0] == 1:
            q, sf = self.math.per_token_cast_to_fp8(x, use_ue8m0=ue8m0, gran_k=128)
            y = q.view(m, n // 128, 128).float() * sf.unsqueeze(2)
        else:
            q, sf = self.math.per_block_cast_to_fp8(x, use_ue8m0=ue8m0, gran_k=128)
            y = q.view(m // 128, 128, n // 128, 128).float() * sf.view(m // 128, 1, n // 128, 1)
        return y.reshape(m, n).to(x.dtype)


class DeepSeek:
    def __init__(self, src: Path) -> None:
        if not torch.cuda.is_available():
            raise SystemExit("--deepseek: DeepSeek-V3's act_quant is a Triton kernel; it needs a CUDA GPU")
        self.kernel = _load(src / "inference/kernel.py", "deepseek_inference_kernel")

    def fp8_block(self, x: torch.Tensor, fp32: bool) -> torch.Tensor:
        """``act_quant`` on the GPU, dequantized as its ``weight_dequant`` multiplies: ``q.float() * s``."""
        xc = x.cuda().contiguous()
        q, s = self.kernel.act_quant(xc, 128, None if fp32 else "ue8m0")
        m, n = x.shape
        y = q.view(m, n // 128, 128).float() * s.unsqueeze(-1)
        return y.reshape(m, n).to(x.dtype).cpu()


# --- the runs ---------------------------------------------------------------------------------------------


def runner(rule: UpstreamRule, up: dict) -> Optional[Callable[[torch.Tensor, Optional[torch.Tensor]], torch.Tensor]]:
    """``fn(x2d, amax)`` running ``rule``'s upstream on one expert, or ``None`` when its project is not loaded."""
    proj = PROJECT_OF.get(rule.project)
    if proj not in up:
        return None
    o, tile = dict(rule.options), rule.tile
    u = up[proj]
    if rule.fmt == "fp8_block":
        pow2 = not o.get("fp32_scale", False)
        if proj == "te":
            return lambda x, a: u.fp8_block(x, tile, pow2)
        if proj == "deepgemm":
            return lambda x, a: u.fp8_block(x, tile, pow2)
        return lambda x, a: u.fp8_block(x, not pow2)
    if rule.fmt == "nvfp4":
        return lambda x, a: u.nvfp4(x, a, tile)
    if rule.fmt == "mxfp4":
        return lambda x, a: u.mxfp4(x)
    if rule.fmt == "mxfp8":
        return lambda x, a: u.mxfp8(x, tile)
    raise ValueError(f"no runner for {rule.id}")


def provenance(rule: UpstreamRule, src: Path, argv: list[str]) -> dict:
    dev = torch.cuda.get_device_name() if (PROJECT_OF[rule.project] == "deepseek" and torch.cuda.is_available()) else platform.processor() or "cpu"
    meta = {"project": rule.project, "version": rule.version, "commit": _git_commit(src) or rule.version, "source": rule.source,
            "variant": rule.variant, "options": dict(rule.options), "amax": list(rule.amax), "torch": torch.__version__, "device": dev,
            "date": datetime.date.today().isoformat(), "command": " ".join(["python", "scripts/upstream_vectors.py", *argv])}
    if PROJECT_OF[rule.project] == "deepseek":
        import triton

        meta["triton"] = triton.__version__
    return meta


def generate(up: dict, srcs: dict, out: Path, argv: list[str]) -> list[str]:
    written = []
    groups: dict[tuple, list[UpstreamRule]] = {}
    for r in RULES:
        if r.judge == "vectors" and PROJECT_OF.get(r.project) in up:
            groups.setdefault((r.fmt, r.tile, tuple(sorted((k, v) for k, v in r.options.items() if k != "fp32_scale"))), []).append(r)
    for (fmt, tile, opts), rules in groups.items():
        path = out / vectors_name(fmt, tile)
        classes = block_classes(fmt, dict(opts))
        vec = Vectors.load(path.read_bytes()) if path.exists() else Vectors(fmt, tile, meta={"rules": {}})
        fresh = {c.name: c.x for c in classes}
        changed = [k for k in vec.inputs if k not in fresh or not torch.equal(vec.inputs[k].view(torch.int16), fresh[k].view(torch.int16))]
        if changed:
            raise SystemExit(f"{path}: the classes {changed} are not the ones built now; regenerate every rule of this file "
                             "(delete it and give every source tree)")
        vec.inputs = fresh
        vec.meta.setdefault("rules", {})
        vec.meta["classes"] = list(CLASSES)
        for r in rules:
            run = runner(r, up)
            for c in classes:
                for policy in r.amax or (None,):
                    amax = None if policy is None else AMAX_POLICIES[policy](c.x)
                    y = torch.stack([run(c.x[e], None if amax is None else amax[e]) for e in range(c.x.shape[0])])
                    vec.outputs[output_key(r.id, c.name, policy)] = y.to(torch.bfloat16)
            vec.meta["rules"][r.id] = provenance(r, srcs[PROJECT_OF[r.project]], argv)
            print(f"{r.id}: {len(classes)} classes, {sum(c.x.numel() for c in classes)} elements")
        out.mkdir(parents=True, exist_ok=True)
        vec.save(path)
        written.append(f"{path} ({os.path.getsize(path)} bytes)")
    return written


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--te", type=Path)
    p.add_argument("--deepgemm", type=Path)
    p.add_argument("--deepseek", type=Path)
    p.add_argument("--only", default="")
    p.add_argument("--out", type=Path, default=Path("reference/data/upstream"))
    p.add_argument("--build", type=Path, default=Path(tempfile.gettempdir()) / "moe_fq_parity_upstream_build")
    a = p.parse_args(argv)
    srcs = {k: v for k, v in (("te", a.te), ("deepgemm", a.deepgemm), ("deepseek", a.deepseek)) if v is not None}
    only = [s for s in a.only.split(",") if s] or list(srcs)
    missing = [s for s in only if s not in srcs]
    if missing:
        p.error(f"--only {missing}: give the source tree (--{missing[0]} DIR)")
    up: dict = {}
    if "te" in only:
        up["te"] = TE(srcs["te"], a.build)
    if "deepgemm" in only:
        up["deepgemm"] = DeepGEMM(srcs["deepgemm"])
    if "deepseek" in only:
        up["deepseek"] = DeepSeek(srcs["deepseek"])
    for line in generate(up, srcs, a.out, argv):
        print("wrote", line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
