"""Built-in mutants: backends that meet the contract but carry one bug a real kernel could have.

Each mutant computes the reference's default semantics except for one deliberate change, written
as a small function here (a *mutated copy* of one step of the op sequence in ``reference/``).
``moe-fq-parity selftest`` runs every mutant through the relevant suite and requires that some
check fails on some generated case (the mutant is *killed*).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from moe_fq_parity import reference as R
from moe_fq_parity.reference import fp8_block as FB
from moe_fq_parity.reference import mx as MX
from moe_fq_parity.reference.constants import E4M3_MAX, E8M0_NAN, TINY_AMAX
from moe_fq_parity.reference.granularity import from_tiles, to_tiles
from moe_fq_parity.reference.formats import E2M1_GRID, E4M3_GRID, FORMATS, MinifloatGrid, format_spec
from moe_fq_parity.reference.nvfp4 import from_blocks, to_blocks
from moe_fq_parity.reference.rounding import (
    fp32_scalar_like, round_to_e2m1, round_to_e2m1_te, round_to_e4m3, round_to_minifloat, to_output_dtype,
)

Tensor = torch.Tensor


# --- mutated single steps -------------------------------------------------------------------

def _int_fq(x: Tensor, a: Tensor, fmt: str, *, unsigned=False, narrow_range=False, scale="div", rnd="even",
            clamp=True, dequant="div", tiny="zero", cast="rne") -> Tensor:
    """INT fake quant of one expert with selectable (mutated) steps; defaults = reference ``cuda``.
    ``scale="step"``: the step ``RN(amax/qmax)`` instead of the scale, ``v = RN(x/step)``,
    ``y = RN(q*step)`` (a valid op order of its own, the reference's ``step`` variant, but not the
    default's)."""
    lo, qmax = format_spec(fmt).grid.bounds(unsigned=unsigned, narrow_range=narrow_range)
    xf = x.float()
    a = a.float().reshape(a.shape + (1,) * (x.dim() - a.dim()))
    q_t = fp32_scalar_like(qmax, xf)
    s = q_t / a if scale == "div" else (a / q_t if scale == "step" else torch.reciprocal(a) * q_t)
    v = xf / s if scale == "step" else xf * s
    r = torch.round(v) if rnd == "even" else torch.sign(v) * torch.floor(v.abs() + 0.5)
    q = torch.clamp(r, lo, qmax) if clamp else r
    if scale == "step":
        y = q * s
    else:
        y = q / s if dequant == "div" else q * torch.reciprocal(s)
    if tiny == "zero":
        y = torch.where(a < TINY_AMAX, torch.zeros(()), y)
    else:  # amax == 0 passes x through
        y = torch.where(a == 0, xf, torch.where(a < TINY_AMAX, torch.zeros(()), y))
    return _cast(y, x.dtype, cast)


def _fp8_fq(x: Tensor, a: Tensor, *, saturate=True, tiny="one", cast="rne") -> Tensor:
    xf = x.float()
    a = a.float().reshape(a.shape + (1,) * (x.dim() - a.dim()))
    if tiny == "one":
        a = torch.where(a <= TINY_AMAX, torch.ones(()), a)
    s = fp32_scalar_like(E4M3_MAX, xf) / a
    inv = fp32_scalar_like(1.0, xf) / s
    v = xf * s
    if saturate:
        e = round_to_e4m3(v)
    else:  # no saturation: values past 448 keep growing on the e4m3 exponent grid
        e = round_to_minifloat(v, mantissa_bits=3, min_normal_exp=-6, max_value=float("inf"))
    y = e * inv
    if tiny == "passthrough":
        y = torch.where(a == 0, xf, y)
    return _cast(y, x.dtype, cast)


def _e2m1_ties_up(v: Tensor) -> Tensor:
    """E2M1 rounding with ties away from zero instead of to even."""
    c = torch.clamp(v, -6.0, 6.0)
    _, e = torch.frexp(c)
    k = torch.clamp_min(e - 2, -1).float()
    step = torch.pow(2.0, k)
    return torch.sign(c) * torch.floor(c.abs() / step + 0.5) * step


def _nvfp4_fq(x: Tensor, g: Tensor, *, block_size=16, e2m1=round_to_e2m1_te, round_block_scale=True, write_tail=True,
              cast="rne", dequant="te") -> Tensor:
    """``reference.nvfp4`` variant ``te`` of one expert, one step selectable (mutated); ``dequant="gemm"``:
    ``RN(RN(q * ds8) * gd)`` instead of TE's ``RN(q * RN(RN(ds8 * g) * RN(1/2688)))``."""
    xf = x.float()
    n = x.shape[-1]
    xb = to_blocks(xf, block_size)
    g = g.float().reshape(g.shape + (1,) * (xb.dim() - g.dim()))
    fmax = fp32_scalar_like(torch.finfo(torch.float32).max, xf)
    ge = torch.minimum(fp32_scalar_like(2688.0, xf) / g, fmax)
    ge = torch.where(ge == 0, torch.ones(()), ge)
    gd = fp32_scalar_like(1.0, xf) / ge
    mult = ge * torch.reciprocal(fp32_scalar_like(6.0, xf))
    ds = xb.abs().amax(dim=-1, keepdim=True) * mult
    ds8 = round_to_e4m3(ds) if round_block_scale else torch.clamp(ds, max=E4M3_MAX)
    es = torch.minimum(fp32_scalar_like(1.0, xf) / (ds8 * gd), fmax)
    q = e2m1(xb * es)
    y = from_blocks((q * ds8) * gd if dequant == "gemm" else q * ((ds8 * g) * torch.reciprocal(fp32_scalar_like(2688.0, xf))), n)
    if not write_tail and n % block_size:
        y[..., n - n % block_size:] = 0.0  # last partial block never stored (buffer was zeroed)
    return _cast(y, x.dtype, cast)


def _cast(y: Tensor, dtype: torch.dtype, how: str) -> Tensor:
    if how == "rne" or dtype == torch.float32:
        return to_output_dtype(y, dtype)
    bits = y.view(torch.int32)
    if dtype == torch.bfloat16:  # truncate: drop the low 16 bits
        return (bits >> 16).to(torch.int16).view(torch.bfloat16)
    return y.to(dtype)


# --- the mutant backends ----------------------------------------------------------------------

Expert = Callable[..., Tensor]


@dataclass
class Mutant:
    """A contract-conforming backend with one bug.  ``bug`` says what a reviewer should look for."""

    name: str
    bug: str
    formats: set[str]
    forward: Callable[..., list[Tensor]] | None = None
    backward: Callable[..., list[Tensor]] | None = None
    device: str = "cpu"
    variants: frozenset[str] = frozenset()
    """Non-default variants it implements too (the variant then reaches ``forward`` as ``variant=``);
    empty: the default variant only."""
    _cache: dict = field(default_factory=dict, repr=False)

    def implements(self, fmt: str, variant: str) -> bool:
        """Whether the self-test runs it on cases of ``fmt``/``variant``."""
        return fmt in self.formats and (variant == R.default_variant(fmt) or variant in self.variants)

    def fake_quant(self, weights: Sequence[Tensor], amax: Tensor, fmt: str, **options) -> list[Tensor]:
        if fmt not in self.formats:
            raise ValueError(f"{self.name} does not implement {fmt}")
        variant = options.pop("variant", None)
        if variant not in (None, "default", R.default_variant(fmt)) and variant not in self.variants:
            raise ValueError(f"{self.name} implements only the default variant of {fmt}")
        if variant in self.variants:
            options["variant"] = variant
        if self.forward is None:
            return R.fake_quant_experts(weights, amax, fmt, **options)
        return self.forward(self, list(weights), amax, fmt, **options)

    def ste_backward(self, weights, amax, grads, fmt, mode, **options) -> list[Tensor]:
        if self.backward is None:
            return R.ste_backward_experts(weights, amax, grads, mode, fmt=fmt)
        return self.backward(self, list(weights), amax, list(grads), fmt, mode)


def _per_expert(step: Callable[..., Tensor]):
    """forward(...) applying ``step(x, a_i, fmt, i, weights, amax, **options)`` per expert."""

    def forward(self: Mutant, weights, amax, fmt, **options):
        per = R.split_expert_amax(weights, amax)
        return [step(w, a, fmt, i, weights, amax, **options) for i, (w, a) in enumerate(zip(weights, per))]

    return forward


def _int_or_fp8(int_kw: dict, fp8_kw: dict | None = None):
    def step(w, a, fmt, i, weights, amax, **options):
        if not format_spec(fmt).is_int:  # the minifloat grid among the INT and FP8 formats
            return _fp8_fq(w, a, **(fp8_kw or {}))
        return _int_fq(w, a, fmt, **options, **int_kw)

    return _per_expert(step)


def _neighbour_amax(self, weights, amax, fmt, **options):
    n = len(weights)
    rolled = torch.roll(amax, shifts=-1, dims=0) if n > 1 else amax
    return R.fake_quant_experts(weights, rolled, fmt, **options)


def _channel_wrong_axis(self, weights, amax, fmt, **options):
    out = []
    for w, a in zip(weights, R.split_expert_amax(weights, amax)):
        if a.dim() == 1 and w.numel():  # per channel: amax indexed by column instead of row
            cols = torch.arange(w.shape[1]) % a.shape[0]
            blocks = [R.fake_quant(w[:, j : j + 1], a[cols[j]].expand(w.shape[0]), fmt, **options) for j in range(w.shape[1])]
            out.append(torch.cat(blocks, dim=1))
        else:
            out.append(R.fake_quant(w, a, fmt, **options))
    return out


def _ragged_expert0_size(self, weights, amax, fmt, **options):
    ref = R.fake_quant_experts(weights, amax, fmt, **options)
    n0 = weights[0].numel() if weights else 0
    out = []
    for w, y in zip(weights, ref):
        if w.numel() > n0:  # elements past expert 0's size never processed: left as input
            y = y.clone().reshape(-1)
            y[n0:] = w.reshape(-1)[n0:]
            y = y.reshape(w.shape)
        out.append(y)
    return out


def _stale_cache(self, weights, amax, fmt, **options):
    key = (fmt, tuple(w.data_ptr() for w in weights), tuple(sorted(options.items())))
    if key not in self._cache:  # amax gathered once per set of weights and never invalidated
        self._cache[key] = amax.clone()
    return R.fake_quant_experts(weights, self._cache[key], fmt, **options)


def _nvfp4(kw: dict):
    def step(w, a, fmt, i, weights, amax, **options):
        if format_spec(fmt).block is None:  # the NVFP4 steps apply to two-level block scaling only
            return R.fake_quant(w, a, fmt, **options)
        return _nvfp4_fq(w, a, block_size=options.get("block_size", 16), **kw)

    return _per_expert(step)


def _clipped_lt(self, weights, amax, grads, fmt, mode):
    if mode == "pass_through":
        return grads
    return [torch.where(w.float().abs() < a.float().reshape(a.shape + (1,) * (w.dim() - a.dim())), g, torch.zeros((), dtype=g.dtype))
            for w, a, g in zip(weights, R.split_expert_amax(weights, amax), grads)]


def _drop_last_grad(self, weights, amax, grads, fmt, mode):
    out = R.ste_backward_experts(weights, amax, grads, mode, fmt=fmt)
    if out and mode == "pass_through":
        out[-1] = torch.zeros_like(out[-1])
    return out


def _writes_into_inputs(self, weights, amax, fmt, **options):
    out = R.fake_quant_experts(weights, amax, fmt, **options)
    with torch.no_grad():
        for w, y in zip(weights, out):  # the outputs are right; the inputs are overwritten with them
            w.copy_(y)
    return out


def _declines_nvfp4(self, weights, amax, fmt, **options):
    if format_spec(fmt).block is not None:  # listed in ``formats`` but never implemented: the coverage silently vanishes
        raise NotImplementedError(f"{fmt} is not implemented yet")
    return R.fake_quant_experts(weights, amax, fmt, **options)


# --- block-scaled formats (scales from the data per tile) ---------------------------------------

_MX_ELEMENTS: dict[MinifloatGrid, str] = {E4M3_GRID: "e4m3", E2M1_GRID: "e2m1"}
"""An MX format's element grid (``FormatSpec.grid``) -> its ``reference.mx.ELEMENTS`` key."""
_MX_SCALE = "e8m0"
"""The tile-scale encoding of the MX formats (``TileScaling.scale``)."""


def _mx_fq(x: Tensor, fmt: str, variant: str, *, tile_2d=False, code_rule=None, amax_bf16=False, nonfinite_code=E8M0_NAN,
           code0_zero=False, axis="in", code0_inverse=None, skip_nan=None) -> Tensor:
    """MX fake quant of one expert (``reference.mx`` steps 1-7, the variant's ``mx_rule``) with one step
    selectable (mutated); ``skip_nan`` overrides whether the block amax skips NaN elements."""
    elem = _MX_ELEMENTS[format_spec(fmt).grid]
    emax, mbits, emx, _ = MX.ELEMENTS[elem]
    rule = MX.mx_rule(variant, elem)
    elem_round = rule.elem_round
    tile = MX.mx_tile(tile_2d)
    tile = (tile[1], tile[0]) if axis == "out" else tile
    xt = to_tiles(x.float(), tile)
    a = MX.block_amax(xt, rule.skip_nan if skip_nan is None else skip_nan).squeeze(-1)
    if amax_bf16:  # amax rounded to bf16 before the exponent is taken
        a = a.to(torch.bfloat16).float()
    code = (code_rule or rule.code)(a, emax, mbits, emx)
    if nonfinite_code != E8M0_NAN:
        code = torch.where(torch.isfinite(a), code, torch.full_like(code, nonfinite_code))
    code = code.unsqueeze(-1)
    inv = MX.mx_inverse(code, rule.inverse)
    if code0_inverse is not None:  # step 3's multiplier for code 0 replaced
        inv = torch.where(code == 0, torch.full((), code0_inverse), inv)
    dec = MX.e8m0_decode(code)
    if code0_zero:  # E8M0 code 0 decoded as 0 instead of 2**-127
        dec = torch.where(code == 0, torch.zeros(()), dec)
    y = elem_round(xt * inv) * dec
    return to_output_dtype(from_tiles(y, tile, tuple(x.shape)), x.dtype)


def _mx_fq_elem(x: Tensor, variant: str, elem_round: Callable[[Tensor], Tensor]) -> Tensor:
    """``reference.mx`` MXFP4 ``variant`` with its element rounding replaced."""
    rule = MX.mx_rule(variant, "e2m1")
    xt = to_tiles(x.float(), MX.mx_tile(False))
    a = MX.block_amax(xt, rule.skip_nan)
    code = rule.code(a, 2, 1, 6.0)
    y = elem_round(xt * MX.mx_inverse(code, rule.inverse)) * MX.e8m0_decode(code)
    return to_output_dtype(from_tiles(y, MX.mx_tile(False), tuple(x.shape)), x.dtype)


def _mx(kw: dict, only: str | None = None):
    """forward(...) of an MX mutant: ``_mx_fq`` with ``kw`` (for the variant ``only`` alone, when given)."""

    def forward(self: Mutant, weights, amax, fmt, variant=None, tile_2d=False, **options):
        v = variant or R.default_variant(fmt)
        return [_mx_fq(w, fmt, v, tile_2d=tile_2d, **(kw if only in (None, v) else {})) for w in weights]

    return forward


def _fp8_block_fq(x: Tensor, *, tile_2d=False, fp32_scale=False, pow2="floor", nan_scale="frexp", axis="in", dequant="recip",
                  inf_scale="dtype") -> Tensor:
    """``reference.fp8_block`` variant ``te`` for one expert, one step selectable (mutated); ``inf_scale="fp32"``:
    an infinite scale replaced by FP32_MAX instead of the input dtype's largest value."""
    tile = FB.fp8_tile(tile_2d)
    tile = (tile[1], tile[0]) if axis == "out" else tile
    xt = to_tiles(x.float(), tile)
    a = xt.abs().amax(dim=-1, keepdim=True)
    s = fp32_scalar_like(E4M3_MAX, a) / a
    big = torch.finfo(torch.float32 if inf_scale == "fp32" else x.dtype).max
    s = torch.where(s == float("inf"), fp32_scalar_like(big, a), s)
    if not fp32_scale:
        p = FB.pow2_floor(s)
        if pow2 == "ceil":  # the power of two at or above the scale
            p = torch.where(p == s, p, p * 2)
        if nan_scale == "nan":  # NaN amax keeps a NaN scale (no frexp exponent 0)
            p = torch.where(torch.isnan(s), s, p)
        s = torch.where(a == float("inf"), torch.zeros(()), p)
    s = torch.where(a == 0, torch.ones(()), s)
    q = round_to_e4m3(xt * s)
    y = q / s if dequant == "div" else q * (fp32_scalar_like(1.0, xt) / s)
    return to_output_dtype(from_tiles(y, tile, tuple(x.shape)), x.dtype)


def _fp8_block(kw: dict):
    def forward(self: Mutant, weights, amax, fmt, variant=None, tile_2d=False, fp32_scale=False, **options):
        return [_fp8_block_fq(w, tile_2d=tile_2d, fp32_scale=fp32_scale, **kw) for w in weights]

    return forward


def _int4_group_fq(x: Tensor, *, axis="in", tiny="zero") -> Tensor:
    """``reference.int_group`` variant ``cuda`` for one expert, one step selectable (mutated)."""
    tile = (128, 1) if axis == "out" else (1, 128)
    xt = to_tiles(x.float(), tile)
    y = _int_fq(xt, xt.abs().amax(dim=-1), "int4", tiny=tiny, cast="rne")
    return to_output_dtype(from_tiles(y.float(), tile, tuple(x.shape)), x.dtype)


def _tiles_wrong_axis(self, weights, amax, fmt, variant=None, tile_2d=False, **options):
    spec = format_spec(fmt)
    if spec.is_int:  # INT4 group-wise
        return [_int4_group_fq(w, axis="out") for w in weights]
    if spec.tiles is not None and spec.tiles.scale != _MX_SCALE:  # FP8 block-wise
        return [_fp8_block_fq(w, tile_2d=tile_2d, axis="out", **options) for w in weights]
    return [_mx_fq(w, fmt, variant or R.default_variant(fmt), tile_2d=tile_2d, axis="out") for w in weights]


def _variant_step(fmt_name: str, variant: str, fn: Callable[..., Tensor]):
    """forward(...) of a mutant of one non-default variant: ``fn(x, **options)`` per expert (``fmt_name``
    only; every other case goes to the reference)."""

    def forward(self: Mutant, weights, amax, fmt, variant=None, **options):
        if fmt != fmt_name or variant != variant_name:
            return R.fake_quant_experts(weights, amax, fmt, **({"variant": variant} if variant else {}), **options)
        return [fn(w, **options) for w in weights]

    variant_name = variant
    return forward


def _deepseek_no_floor(x: Tensor, *, fp32_scale=False, **_) -> Tensor:
    """``reference.fp8_block`` ``deepseek`` without its amax floor ``max(A, 1e-4)`` (the pre-V3.1 kernel)."""
    xt = to_tiles(x.float(), (1, FB.FP8_BLOCK))
    mag = xt.abs()
    a = torch.where(torch.isnan(mag), torch.zeros(()), mag).amax(dim=-1, keepdim=True)
    s = a * torch.reciprocal(fp32_scalar_like(E4M3_MAX, a))
    if not fp32_scale:
        s = torch.where(torch.isinf(s) | (s == 0), s, FB.ue8m0_ceil(s, lo=0, hi=255))
    y = round_to_e4m3(xt / s) * s
    return to_output_dtype(from_tiles(y, (1, FB.FP8_BLOCK), tuple(x.shape)), x.dtype)


def _deepgemm_division(x: Tensor, *, tile_2d=False, fp32_scale=False, **_) -> Tensor:
    """``reference.fp8_block`` ``deepgemm`` with ``x / sf`` instead of ``x * RN(1/sf)``."""
    tile = FB.fp8_tile(tile_2d)
    xt = to_tiles(x.float(), tile)
    sf = FB.deepgemm_scale(xt.abs().amax(dim=-1, keepdim=True), fp32_scale=fp32_scale)
    return to_output_dtype(from_tiles(round_to_e4m3(xt / sf) * sf, tile, tuple(x.shape)), x.dtype)


def _int4_modelopt_gate_per_group(x: Tensor, *, group_size=128, **_) -> Tensor:
    """``reference.int_group`` ``modelopt`` with the zero-amax mask applied to every group with amax <= 2**-24
    whatever the other groups hold (Model-Optimizer tests its gate once per tensor on ``min(amax)``, which
    a NaN group turns off)."""
    tile = (1, group_size)
    xt = to_tiles(x.float(), tile)
    a = xt.abs().amax(dim=-1, keepdim=True)
    masked = a <= TINY_AMAX
    s = fp32_scalar_like(7.0, xt) / a
    q = torch.clamp(torch.round(xt * torch.where(masked, torch.zeros(()), s)), -8.0, 7.0)
    y = q / torch.where(masked, torch.ones(()), s)
    return to_output_dtype(from_tiles(y, tile, tuple(x.shape)), x.dtype)


def _ignores_tile_2d(self, weights, amax, fmt, tile_2d=False, **options):
    """The reference with ``tile_2d`` dropped: 1D blocks where square tiles were asked for."""
    return R.fake_quant_experts(weights, amax, fmt, **options)


def build_mutants() -> list[Mutant]:
    """Fresh instances of every built-in mutant (fresh caches), over the formats registered now:
    the INT mutants apply to every INT format (``_int_fq`` takes its grid from the registry), the
    NVFP4 ones to NVFP4 (they mutate steps of its op sequence), the rest to all formats."""
    all_formats = set(FORMATS)
    with_amax = {f for f in all_formats if format_spec(f).takes_amax}
    mx = {f for f in ("mxfp8", "mxfp4") if f in all_formats}
    ints = {f for f in with_amax if format_spec(f).is_int}
    int_fp8 = ints | {"fp8_e4m3"}
    per_channel = {f for f in int_fp8 if "per_channel" in format_spec(f).amax_granularities}
    two_d = {f for f in all_formats if format_spec(f).option("tile_2d") is not None}
    return [
        Mutant("scale-reciprocal", "scale computed as reciprocal(amax) * qmax (two roundings)", ints, _int_or_fp8({"scale": "reciprocal"})),
        Mutant("step-multiply", "step = amax/qmax, q = rint(x/step), y = q*step instead of the scale qmax/amax and y = q/s", ints,
               _int_or_fp8({"scale": "step"})),
        Mutant("round-half-away", "rint replaced by round half away from zero", ints, _int_or_fp8({"rnd": "away"})),
        Mutant("bf16-truncate", "fp32 -> bf16 output truncated instead of rounded to nearest even", int_fp8, _int_or_fp8({"cast": "trunc"}, {"cast": "trunc"})),
        Mutant("dequant-reciprocal", "dequantization y = q * RN(1/s) instead of RN(q/s)", ints, _int_or_fp8({"dequant": "recip"})),
        Mutant("neighbour-amax", "expert i reads the amax of expert i+1", with_amax, _neighbour_amax),
        Mutant("no-saturation", "no clamp of the quantized value when |x| > amax", int_fp8, _int_or_fp8({"clamp": False}, {"saturate": False})),
        Mutant("zero-amax-passthrough", "amax == 0 passes x through unquantized", int_fp8, _int_or_fp8({"tiny": "passthrough"}, {"tiny": "passthrough"})),
        Mutant("nvfp4-unrounded-block-scale", "NVFP4 block scale not rounded to E4M3", {"nvfp4"}, _nvfp4({"round_block_scale": False})),
        Mutant("e2m1-ties-up", "E2M1 ties rounded away from zero instead of to even", {"nvfp4"}, _nvfp4({"e2m1": _e2m1_ties_up})),
        Mutant("nvfp4-tail-unwritten", "last partial NVFP4 block never written", {"nvfp4"}, _nvfp4({"write_tail": False})),
        Mutant("channel-wrong-axis", "per-channel amax broadcast along columns instead of rows", per_channel, _channel_wrong_axis),
        Mutant("ragged-expert0-size", "ragged experts processed with expert 0's element count", all_formats, _ragged_expert0_size),
        Mutant("stale-amax-cache", "amax vector cached on first call and never invalidated", with_amax, _stale_cache),
        Mutant("clipped-ste-lt", "clipped STE keeps |x| < amax instead of <= amax", with_amax, None, _clipped_lt),
        Mutant("pass-through-drops-last", "pass-through gradient of the last expert dropped", all_formats, None, _drop_last_grad),
        Mutant("writes-into-inputs", "correct outputs, but written into the input weights too (w.copy_(out))", all_formats, _writes_into_inputs),
        Mutant("declared-then-declined", "declares nvfp4 in formats, then raises NotImplementedError for it", {"nvfp4"} & all_formats | ints,
               _declines_nvfp4),
        Mutant("mx-floor-for-ceil", "MX ceil rule computed with the floor rule (one binade low on most blocks)", mx,
               _mx({"code_rule": MX.code_floor}), variants=frozenset({"ceil"})),
        Mutant("fp8-block-dequant-division", "FP8 block-wise fp32 scales: y = RN(q / s) instead of RN(q * RN(1/s))",
               {"fp8_block"} & all_formats, _fp8_block({"dequant": "div"})),
        Mutant("mx-amax-through-bf16", "MX block amax rounded to bf16 before its exponent is taken", mx, _mx({"amax_bf16": True})),
        Mutant("mx-inf-block-0xfe", "MX floor rule: an inf/NaN block gets code 0xFE (saturated) instead of 0xFF (NaN)", mx,
               _mx({"nonfinite_code": 0xFE})),
        Mutant("mx-torchao-code0-unclamped", "torchao FLOOR: a code-0 block quantized at 2**-127 (torchao clamps its fp32 scale to "
               "2**-126)", mx, _mx({"code0_inverse": 2.0**127}), variants=frozenset({"torchao_floor"})),
        Mutant("e8m0-code0-as-zero", "E8M0 code 0 decoded as 0 instead of 2**-127", mx, _mx({"code0_zero": True})),
        Mutant("tile-wrong-axis", "blocks of 32 / 128 along out-features instead of in-features (1D blocks transposed)",
               mx | ({"fp8_block", "int4_group"} & all_formats), _tiles_wrong_axis),
        *(Mutant(f"tile-2d-ignored-{f}", f"{f}: tile_2d ignored (1D blocks where square tiles were asked for)", {f}, _ignores_tile_2d)
          for f in sorted(two_d)),  # one per format: smoke must kill it in each
        Mutant("int4-group-zero-amax-passthrough", "INT4 group-wise: a block with amax 0 passes x through (no zero-amax rule)",
               {"int4_group"} & all_formats, lambda self, weights, amax, fmt, **o: [_int4_group_fq(w, tiny="passthrough") for w in weights]),
        Mutant("fp8-block-pow2-up", "FP8 block-wise pow2 scale rounded up instead of down", {"fp8_block"} & all_formats, _fp8_block({"pow2": "ceil"})),
        Mutant("fp8-block-nan-scale", "FP8 block-wise: a tile holding NaN keeps a NaN scale (TE's frexp gives 2**-1)",
               {"fp8_block"} & all_formats, _fp8_block({"nan_scale": "nan"})),
        Mutant("fp8-block-te-fp32-max", "FP8 block-wise te fp32 scales: an infinite scale replaced by FP32_MAX, not the input dtype's max "
               "(TE's finfo(x_dtype).max)", {"fp8_block"} & all_formats, _fp8_block({"inf_scale": "fp32"})),
        Mutant("mx-te-nan-amax", "MXFP8 te: the block amax propagates NaN (TE's max skips it)", {"mxfp8"} & all_formats,
               _mx({"skip_nan": False}, only="te"), variants=frozenset({"te"})),
        Mutant("mx-te-code0-one", "MXFP8 te: code 0 quantized with 1 (TE before its exp2f_rcp fix) instead of 2**127",
               {"mxfp8"} & all_formats, _mx({"code0_inverse": 1.0}, only="te"), variants=frozenset({"te"})),
        Mutant("mxfp4-te-keeps-minus-zero", "MXFP4 te: a scaled -0.0 kept as -0 (TE's cast_to_fp4x2 codes it +0)",
               {"mxfp4"} & all_formats, _variant_step("mxfp4", "te", lambda w, **o: _mx_fq_elem(w, "te", round_to_e2m1)),
               variants=frozenset({"te"})),
        Mutant("deepseek-no-amax-floor", "FP8 block-wise deepseek without max(amax, 1e-4): an all-zero tile is 0/0 = NaN",
               {"fp8_block"} & all_formats, _variant_step("fp8_block", "deepseek", _deepseek_no_floor), variants=frozenset({"deepseek"})),
        Mutant("deepgemm-division", "FP8 block-wise deepgemm: x / sf instead of x * RN(1/sf) (differs with fp32_scale)",
               {"fp8_block"} & all_formats, _variant_step("fp8_block", "deepgemm", _deepgemm_division), variants=frozenset({"deepgemm"})),
        Mutant("nvfp4-te-gemm-order", "NVFP4 te dequantized RN(RN(q * ds8) * gd) (a GEMM's order), not TE's RN(q * RN(RN(ds8 * g) / 2688))",
               {"nvfp4"}, _nvfp4({"dequant": "gemm"})),
        Mutant("nvfp4-te-keeps-minus-zero", "NVFP4 te: a scaled -0.0 kept as -0 (TE codes it +0)", {"nvfp4"}, _nvfp4({"e2m1": round_to_e2m1})),
        Mutant("int4-modelopt-gate-per-group", "INT4 group-wise modelopt: the zero-amax mask applied per group even where a NaN group "
               "turns Model-Optimizer's once-per-tensor gate off",
               {"int4_group"} & all_formats, _variant_step("int4_group", "modelopt", _int4_modelopt_gate_per_group),
               variants=frozenset({"modelopt"})),
    ]
