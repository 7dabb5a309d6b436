"""The comparison policy: what counts as equal, stated once.  Every check and section compares through here.

Forward parity (``checks.forward``), the STE backward checks, the invariants, the MoE section, the
distributed checkpoint section and the external-backend section all decide "equal or not" with the
functions of this module (``same_bits``, ``bitwise``, ``bit_diff``) or with ``harness.core.ulp.compare``,
which applies the same rules and adds ULP classes.

The policy
----------

* **NaN payload and sign are not part of the value** (default, ``nan_bits="any"``).  IEEE 754 leaves
  the payload and the sign of a NaN result to the implementation, and the implementations this
  harness judges differ: CUDA produces the canonical bf16 NaN ``0x7FFF``; torch on the CPU and numpy
  produce the quiet NaN ``0x7FC0``; a NaN input may pass through with its own payload and sign.  A
  NaN where the reference has a NaN is therefore *equal*, whatever its bits.
* **A NaN where the reference has a number, or a number where it has a NaN, is an error** in every
  mode (``±inf`` is a number here: ``inf`` vs ``-inf`` or vs a finite value is an error too).
* **``--nan-bits strict``** (``nan_bits="strict"``) is for users who need the canonical NaN bits:
  a NaN whose bits differ from the reference's NaN is then a mismatch of its own class,
  ``nan_bits`` (counted apart from ``error``, named in the message, failing the check).  Off by default.
* **Signed zero.**  ``-0`` and ``+0`` are different bit patterns and the reference defines which one
  a fake quant produces, so everywhere bitwise identity is demanded they differ.  The forward
  check's ``1-ulp`` mode (the upstream acceptance) is the one exception: there a sign-of-zero
  difference has ULP distance 0 and passes, counted in ``signed_zero``; forward ``strict`` fails it.
* **Where bitwise identity is demanded** (up to NaN payload under the default): forward ``strict``;
  ``backward.pass_through`` and ``backward.clipped``; ``invariant.layout``, ``invariant.grouped`` and
  ``invariant.recalibrate``; every MoE, distributed and external section comparison.  "Bitwise" in
  this code base always means ``same_bits`` under the run's ``nan_bits`` policy.

Offenders
---------

A comparison counts *every* mismatch and keeps the first ``MAX_OFFENDERS`` of them (in list, then
flat-index order) as ``records.Offender`` entries, with the value and the bit pattern on both sides,
so a NaN-payload difference shows as ``nan (0x7FFF)`` vs ``nan (0x7FC0)``, never as ``nan`` vs ``nan``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

import torch

from .bits import BIT_VIEWS, bits_equal, check_nan_bits, is_nan, nan_bits_differ
from .records import Offender
from .tolerances import DEFAULT_NAN_BITS, NAN_BITS_MODES  # noqa: F401 - the policy's names, re-exported
from .ulp import CLASSES, Comparison, compare, ulp_distance

MAX_OFFENDERS = 10
"""How many offenders any comparison keeps (the first ones); every mismatch is counted regardless."""

def same_bits(expected: torch.Tensor, got: torch.Tensor, nan_bits: str = DEFAULT_NAN_BITS) -> torch.Tensor:
    """The policy's elementwise equality: same bit pattern, or both NaN (under ``nan_bits="any"``).

    ``+0 != -0`` always.  Integer and bool tensors compare by value.
    """
    check_nan_bits(nan_bits)
    g = got.to(expected.device)
    eq = bits_equal(expected, g)
    if nan_bits == "any":
        eq = eq | (is_nan(expected) & is_nan(g))
    return eq


def bits_hex(v: torch.Tensor) -> str:
    """Bit pattern of a one-element float tensor as hex (``0x7FC0``); ``""`` for other dtypes."""
    if v.dtype not in BIT_VIEWS:
        return ""
    int_dtype, width, mask = BIT_VIEWS[v.dtype]
    return f"0x{int(v.reshape(1).view(int_dtype).item()) & mask:0{width}X}"


def bits_hex_all(t: torch.Tensor) -> list[str]:
    """Bit patterns of every element of a bf16/fp16/fp32 tensor as hex (``bits_hex``, vectorised);
    ``TypeError`` for other dtypes."""
    flat = t.detach().reshape(-1).cpu()
    if flat.dtype not in BIT_VIEWS:
        raise TypeError(f"no bit view for {flat.dtype}")
    int_dtype, width, mask = BIT_VIEWS[flat.dtype]
    return [f"0x{int(v) & mask:0{width}X}" for v in flat.view(int_dtype).tolist()]


def offenders_at(parts: Sequence[int], index: torch.Tensor, shapes: Sequence[torch.Size], expected: torch.Tensor, got: torch.Tensor,
                 cls: Sequence[str], ulp: Sequence[Optional[int]], *, inputs: torch.Tensor, pre_round: torch.Tensor,
                 amax: torch.Tensor) -> tuple[Offender, ...]:
    """``offender`` for many elements at once (one host transfer per field): ``parts[k]`` is the
    tensor (expert) of flat element ``index[k]`` of tensors laid out one after another with
    ``shapes``; ``expected``/``got``/``inputs``/``pre_round``/``amax`` are those flat tensors."""
    if index.numel() == 0:
        return ()
    starts = [0]
    for shape in shapes:
        starts.append(starts[-1] + int(torch.Size(shape).numel()))
    pick = lambda t: t.reshape(-1)[index]  # noqa: E731
    e, g, x, pre, a = (pick(t) for t in (expected, got, inputs, pre_round, amax))
    ev, gv, xv, pv, av = (t.double().tolist() for t in (e, g, x, pre, a))
    eh, gh, xh, ah = (bits_hex_all(t) for t in (e, g, x, a))
    out = []
    for k, (p, i) in enumerate(zip(parts, index.tolist())):
        local, cols = i - starts[p], (shapes[p][-1] if len(shapes[p]) and shapes[p][-1] else 1)
        out.append(Offender(expert=p, row=local // cols, col=local % cols, input=xv[k], expected=ev[k], got=gv[k], pre_round=pv[k],
                            ulp=ulp[k], cls=cls[k], expected_bits=eh[k], got_bits=gh[k], input_bits=xh[k], amax=av[k], amax_bits=ah[k]))
    return tuple(out)


def _scalar(t: torch.Tensor, i: int) -> float:
    return float(t.reshape(-1)[i].double()) if t.numel() else float("nan")


def offender(k: int, i: int, expected: torch.Tensor, got: torch.Tensor, cls: str, *, inputs: Optional[torch.Tensor] = None,
             pre_round: Optional[torch.Tensor] = None, ulp: Optional[int] = None, amax: Optional[torch.Tensor] = None) -> Offender:
    """The ``Offender`` at flat index ``i`` of tensor ``k`` (row/col of the tensor seen as ``[-1, last dim]``);
    ``amax``: a per-element amax tensor laid out like ``expected`` (optional)."""
    cols = expected.shape[-1] if expected.dim() and expected.shape[-1] else 1
    e, g = expected.reshape(-1)[i], got.reshape(-1)[i]
    return Offender(
        expert=k, row=i // cols, col=i % cols, input=_scalar(inputs, i) if inputs is not None else None,
        expected=_scalar(expected, i), got=_scalar(got, i), pre_round=_scalar(pre_round, i) if pre_round is not None else None,
        ulp=ulp, cls=cls, expected_bits=bits_hex(e), got_bits=bits_hex(g),
        input_bits=bits_hex(inputs.reshape(-1)[i]) if inputs is not None else "",
        amax=_scalar(amax, i) if amax is not None else None, amax_bits=bits_hex(amax.reshape(-1)[i]) if amax is not None else "",
    )


def bitwise(expected: torch.Tensor, got: torch.Tensor, nan_bits: str = DEFAULT_NAN_BITS):
    """``harness.core.ulp.compare`` re-classified for the checks that demand bitwise identity.

    Every element that is not ``same_bits`` is an ``error``, except a NaN/NaN pair whose bits differ,
    which (only under ``nan_bits="strict"``) is ``nan_bits``.  ``mismatch_ulp`` holds the ULP distance
    of finite pairs (0 elsewhere), for the offender table.
    """
    check_nan_bits(nan_bits)
    g = got.detach().to(expected.device)
    e = expected.detach()
    comp = compare(e, g, nan_bits=nan_bits)
    eq = same_bits(e, g, nan_bits).reshape(-1)
    differ = torch.nonzero(~eq).reshape(-1)
    ef, gf = e.reshape(-1)[differ], g.reshape(-1)[differ]
    ulp = torch.where(torch.isfinite(ef) & torch.isfinite(gf), ulp_distance(ef, gf), 0)
    is_nan_bits = torch.isnan(ef) & torch.isnan(gf)
    cls = torch.where(is_nan_bits, CLASSES.index("nan_bits"), CLASSES.index("error")).to(torch.int8)
    counts = dict.fromkeys(CLASSES, 0)
    counts["nan_bits"] = int(is_nan_bits.sum())
    counts["error"] = int(differ.numel()) - counts["nan_bits"]
    counts["exact"] = comp.numel - int(differ.numel())
    return replace(comp, counts=counts, mismatch_index=differ.cpu(), mismatch_ulp=ulp.cpu(), mismatch_class=cls.cpu())


def compare_each(count: int, expected: Callable[[int], torch.Tensor], got: Sequence[torch.Tensor],
                 full: Callable[[int], Comparison]) -> list[Comparison]:
    """``full(k)`` for every pair ``k < count`` whose bits differ; ``Comparison.identical`` for the others.

    A first pass counts, per pair, the elements whose raw bits differ and the finite elements, on
    the device and without a synchronisation (``expected(k)`` is dropped after it: one expected
    tensor at a time, as the callers' memory budget requires); one transfer then brings all counts
    to the host.  So a check whose experts all match costs one synchronisation instead of ~20 per
    expert; ``full`` (which recomputes what it needs) runs only for the experts that differ.
    """
    stats: list[Optional[torch.Tensor]] = []
    numel: list[int] = []
    for k in range(count):
        e = expected(k).detach()
        g = got[k].detach()
        numel.append(e.numel())
        if e.dtype in BIT_VIEWS and g.dtype == e.dtype and g.shape == e.shape and g.device == e.device:
            stats.append(torch.stack([(~bits_equal(e, g)).sum(), torch.isfinite(e).sum()]))
        else:
            stats.append(None)  # not comparable this way (the full comparison says why)
        del e
    host: list[Optional[list[int]]] = [None] * count
    by_device: dict[torch.device, list[int]] = {}
    for k, t in enumerate(stats):
        if t is not None:
            by_device.setdefault(t.device, []).append(k)
    for ks in by_device.values():
        for k, row in zip(ks, torch.stack([stats[k] for k in ks]).tolist()):
            host[k] = row
    return [Comparison.identical(numel[k], h[1]) if h is not None and h[0] == 0 else full(k) for k, h in enumerate(host)]


@dataclass(frozen=True)
class BitDiff:
    """Bitwise comparison of two tensor lists: every mismatch counted, the first offenders kept.

    ``mismatches`` counts every element that is not ``same_bits`` (``nan_bits`` of them are NaN/NaN
    pairs with different bits, only possible under ``nan_bits="strict"``); ``problems`` are
    comparisons that could not be made element by element (count, shape or dtype differ).
    """

    numel: int
    mismatches: int
    nan_bits: int = 0
    offenders: tuple[Offender, ...] = ()
    problems: tuple[str, ...] = ()
    label: str = "tensor"

    @property
    def equal(self) -> bool:
        return self.mismatches == 0 and not self.problems

    def offender_lines(self) -> tuple[str, ...]:
        return tuple(describe(o, self.label) for o in self.offenders)

    def summary(self) -> str:
        """Problems, then the kind of the mismatches and the offenders (empty when equal)."""
        parts = list(self.problems)
        if self.nan_bits:
            parts.append(f"{self.nan_bits} NaN with other bits than the reference's (--nan-bits strict)")
        return "; ".join(parts + list(self.offender_lines()))


def describe(o: Offender, label: str = "tensor") -> str:
    """``expert 2 at (3, 4): expected 1.5 (0x3FC0), got nan (0x7FC0)``."""

    def side(v: float, bits: str) -> str:
        return f"{v:.9g}" + (f" ({bits})" if bits else "")

    return f"{label} {o.expert} at ({o.row}, {o.col}): expected {side(o.expected, o.expected_bits)}, got {side(o.got, o.got_bits)}"


def bit_diff(expected: Sequence[torch.Tensor], got: Sequence[torch.Tensor], *, label: str = "tensor",
             nan_bits: str = DEFAULT_NAN_BITS, limit: int = MAX_OFFENDERS) -> BitDiff:
    """Compare ``expected[k]`` with ``got[k]`` for every k under the policy (same count, shapes, dtypes)."""
    check_nan_bits(nan_bits)
    problems: list[str] = []
    offenders: list[Offender] = []
    numel = mismatches = n_nan = 0
    if len(expected) != len(got):
        problems.append(f"{len(expected)} expected tensors, {len(got)} got")
    for k, (e, g) in enumerate(zip(expected, got)):
        if not isinstance(g, torch.Tensor):
            problems.append(f"{label} {k}: got {type(g).__name__}, not a tensor")
            continue
        e, g = e.detach(), g.detach().to(e.device)
        if e.shape != g.shape or e.dtype != g.dtype:
            problems.append(f"{label} {k}: expected {e.dtype}{tuple(e.shape)}, got {g.dtype}{tuple(g.shape)}")
            continue
        numel += e.numel()
        bad = torch.nonzero(~same_bits(e, g, nan_bits).reshape(-1)).reshape(-1)
        mismatches += int(bad.numel())
        if bad.numel():
            n_nan += int(nan_bits_differ(e.reshape(-1)[bad], g.reshape(-1)[bad]).sum())
        for i in bad[: max(limit - len(offenders), 0)].tolist():
            both_nan = bool(is_nan(e.reshape(-1)[i]).item() and is_nan(g.reshape(-1)[i]).item())
            offenders.append(offender(k, i, e, g, "nan_bits" if both_nan else "error"))
    return BitDiff(numel, mismatches, n_nan, tuple(offenders), tuple(problems), label)
