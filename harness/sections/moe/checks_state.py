"""State-dict layout checks: indexed <-> grouped parameters and N-quantizer <-> one-vector amax.

Parameter rows (role ``grouped_linear/weight/{name}``, format-independent):

* ``state_dict/roundtrip/{stacked,packed}`` -- indexed -> grouped (``[N,out,in]`` / ``[N*out,in]``,
  biases ``[N,out]`` / ``[N*out]``) -> indexed: every key back, every tensor bit for bit;
* ``state_dict/load/{indexed_to_single,single_to_indexed}`` -- a checkpoint file of one layout
  (``torch.save``; read back with ``weights_only=True``) loaded strictly into a twin of the other
  layout through its pre-hook; unquantized outputs bitwise equal;
* ``state_dict/early_return/{target_present,incomplete,bias_absent}`` -- nothing touched;
* ``state_dict/split_error`` -- a grouped tensor whose dim 0 is not N or a multiple of N raises
  ``ValueError`` naming the key and the shape.

Quantizer rows (role ``grouped_linear/weight/{name}``, per spec):

* ``state_dict/quantizer/roundtrip/{flat,broadcast}`` -- N-quantizer -> one vector -> N-quantizer;
* ``state_dict/quantizer/upstream_keys`` -- the N-quantizer model writes exactly the upstream keys
  ``weight_quantizer_{i}._amax`` (``state_dict.UPSTREAM_KEYS``); a dict with the internal keys
  ``weight_quantizer.{i}._amax`` loads strictly with bitwise-equal amax;
* ``state_dict/quantizer/load/{n_to_vector,vector_to_n}`` -- a file written by one layout loaded
  strictly into the other; per-expert amax and quantized outputs bitwise equal;
* ``state_dict/quantizer/shared_to_n_error`` -- a shared (pre-0.47) amax cannot be split.
"""

from __future__ import annotations

import os
from typing import Callable

import torch

from .bench import Bench, outputs
from .compare import BitDiff, RowSink, bit_diff
from .data import ExpertData, ExpertShape
from .layers import GroupedLinearTwin, set_expert_params
from .quantized import QuantGroupedExperts, set_quant_mode
from .roles import Role
from .state_dict import (
    grouped_to_indexed, indexed_to_grouped, load_checkpoint, n_quantizer_keys, n_to_vector, save_checkpoint, vector_to_n,
)


def dict_diff(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> BitDiff:
    """Same key set and every tensor bitwise equal."""
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    keys = sorted(set(expected) & set(got))
    d = bit_diff([expected[k] for k in keys], [got[k] for k in keys], label="key#")
    problems = d.problems + ((f"missing keys {missing}",) if missing else ()) + ((f"extra keys {extra}",) if extra else ())
    return BitDiff(d.numel, d.mismatches, d.offenders, problems)


def _twin(shape: ExpertShape, data: ExpertData, device: torch.device, *, single: bool, bias: bool) -> GroupedLinearTwin:
    t = GroupedLinearTwin(shape.num_experts, shape.in_features, shape.out_features, bias=bias,
                          params_dtype=shape.dtype, device=device, single_grouped_weight=single)
    set_expert_params(t, data.weights, data.biases if bias else None)
    return t


def _roundtrip(sink: RowSink, role: Role, sd: dict, n: int, packed: bool) -> None:
    check = f"state_dict/roundtrip/{'packed' if packed else 'stacked'}"
    with sink.guard(role, check):
        work = dict(sd)
        actions = [indexed_to_grouped(work, "", p, n, packed=packed) for p in ("weight", "bias")]
        shapes = {p: tuple(work[p].shape) for p in ("weight", "bias") if p in work}
        w0, b0 = sd["weight0"], sd["bias0"]
        want = {"weight": (n * w0.shape[0], w0.shape[1]) if packed else (n,) + tuple(w0.shape),
                "bias": (n * b0.shape[0],) if packed else (n,) + tuple(b0.shape)}
        actions += [grouped_to_indexed(work, "", p, n) for p in ("weight", "bias")]
        diff = dict_diff(sd, work)
        ok = diff.equal and actions == ["converted"] * 4 and shapes == want
        sink.add(role, check, ok=ok, expected=f"converted x4, grouped shapes {want}, bits equal",
                 measured=f"{actions}, {shapes}, " + ("equal" if diff.equal else f"{diff.mismatches} differ"),
                 mismatches=diff.mismatches, detail=diff.summary())


def _load_check(sink: RowSink, role: Role, check: str, src: torch.nn.Module, dst: torch.nn.Module, path: str,
                forward: Callable[[torch.nn.Module], torch.Tensor]) -> None:
    with sink.guard(role, check):
        save_checkpoint(src.state_dict(), path)
        result = dst.load_state_dict(load_checkpoint(path), strict=True)
        diff = bit_diff([forward(src)], [forward(dst)], label="output")
        sink.add_diff(role, check, diff, what=f"strict load ({result}), outputs bitwise equal")


def layout_rows(shape: ExpertShape, data: ExpertData, name: str, sink: RowSink, tmpdir: str, device: torch.device) -> None:
    """Parameter-layout rows for one layer geometry (see module docstring)."""
    role = Role("grouped_linear", "weight", name)
    n = shape.num_experts
    indexed = _twin(shape, data, device, single=False, bias=True)
    sd = {k: v.detach() for k, v in indexed.state_dict().items()}
    _roundtrip(sink, role, sd, n, packed=False)
    _roundtrip(sink, role, sd, n, packed=True)
    x, splits = data.routings["calib"]
    fwd = lambda m: m(x, splits).detach()  # noqa: E731
    _load_check(sink, role, "state_dict/load/indexed_to_single", indexed, _twin(shape, data, device, single=True, bias=True), os.path.join(tmpdir, "indexed.pt"), fwd)
    single = _twin(shape, data, device, single=True, bias=True)
    blank = GroupedLinearTwin(n, shape.in_features, shape.out_features, bias=True, params_dtype=shape.dtype, device=device)
    _load_check(sink, role, "state_dict/load/single_to_indexed", single, blank, os.path.join(tmpdir, "single.pt"), fwd)
    with sink.guard(role, "state_dict/early_return/target_present"):
        both = dict(sd)
        both["weight"] = torch.stack([sd[f"weight{i}"] for i in range(n)])
        before = dict(both)
        acts = [indexed_to_grouped(both, "", "weight", n), grouped_to_indexed(both, "", "weight", n)]
        untouched = both.keys() == before.keys() and all(both[k] is before[k] for k in both)
        sink.add(role, "state_dict/early_return/target_present", ok=acts == ["target_present"] * 2 and untouched,
                 expected="target_present x2, dict untouched", measured=f"{acts}, untouched={untouched}")
    with sink.guard(role, "state_dict/early_return/incomplete"):
        part = {k: v for k, v in sd.items() if k != f"weight{n - 1}"}
        before = dict(part)
        act = indexed_to_grouped(part, "", "weight", n)
        untouched = part.keys() == before.keys()
        sink.add(role, "state_dict/early_return/incomplete", ok=act == "incomplete" and untouched,
                 expected="incomplete, dict untouched", measured=f"{act}, untouched={untouched}")
    with sink.guard(role, "state_dict/early_return/bias_absent"):
        nobias = _twin(shape, data, device, single=False, bias=False)
        nsd = dict(nobias.state_dict())
        acts = [indexed_to_grouped(dict(nsd), "", "bias", n), grouped_to_indexed(dict(nsd), "", "bias", n)]
        target = GroupedLinearTwin(n, shape.in_features, shape.out_features, bias=False, params_dtype=shape.dtype, device=device, single_grouped_weight=True)
        target.load_state_dict(dict(nsd), strict=True)
        diff = bit_diff([fwd(nobias)], [fwd(target)], label="output")
        sink.add(role, "state_dict/early_return/bias_absent", ok=acts == ["absent"] * 2 and diff.equal,
                 expected="absent x2; bias-free indexed -> single loads, outputs equal", measured=f"{acts}, outputs {'equal' if diff.equal else 'differ'}",
                 mismatches=diff.mismatches, detail=diff.summary())
    with sink.guard(role, "state_dict/split_error"):
        bad_shape = (n * shape.out_features + 1, shape.in_features)
        bad = {"experts.weight": torch.zeros(bad_shape)}
        try:
            grouped_to_indexed(bad, "experts.", "weight", n)
            msg = ""
        except ValueError as exc:
            msg = str(exc)
        ok = "experts.weight" in msg and str(bad_shape) in msg
        sink.add(role, "state_dict/split_error", ok=ok, expected=f"ValueError naming 'experts.weight' and {bad_shape}",
                 measured=msg or "no error", detail=msg)


def _fresh(bench: Bench, device: torch.device, **kw) -> QuantGroupedExperts:
    layer = _twin(bench.shape, bench.data, device, single=False, bias=bench.shape.bias)
    m = QuantGroupedExperts(layer, bench.recipe, bench.name, input_layout="per_expert", **kw)
    set_quant_mode(m, "quantize")
    return m


def quantizer_state_rows(bench: Bench, sink: RowSink, tmpdir: str, device: torch.device) -> None:
    """Quantizer-state rows for one spec (see module docstring); uses the bench's twin models."""
    role = Role("grouped_linear", "weight", bench.name)
    n = bench.shape.num_experts
    nq = bench.weight_models["n_quantizer"]
    nd = len(nq.weight_quantizer.piece)
    sd = {k: v.detach() for k, v in nq.state_dict().items()}
    for form in ("flat", "broadcast"):
        check = f"state_dict/quantizer/roundtrip/{form}"
        with sink.guard(role, check):
            work = dict(sd)
            a1 = n_to_vector(work, "", n, piece_ndim=nd, form=form)
            vshape = tuple(work["weight_quantizer._amax"].shape)
            a2 = vector_to_n(work, "", n, piece_ndim=nd)
            diff = dict_diff(sd, work)
            want = (n,) + nq.weight_quantizer.piece
            want = want + (1,) * (3 - len(want)) if form == "broadcast" else want
            sink.add(role, check, ok=diff.equal and [a1, a2] == ["converted"] * 2 and vshape == want,
                     expected=f"converted x2, vector {want}, bits equal", measured=f"{[a1, a2]}, {vshape}, " + ("equal" if diff.equal else "differ"),
                     mismatches=diff.mismatches, detail=diff.summary())
    with sink.guard(role, "state_dict/quantizer/upstream_keys"):
        upstream = n_quantizer_keys("", n, naming="suffix")
        internal = n_quantizer_keys("", n, naming="list")
        written = sorted(k for k in sd if k.startswith("weight_quantizer"))
        work = {internal[upstream.index(k)] if k in upstream else k: v for k, v in sd.items()}
        dst = _fresh(bench, device, per_expert=True, weight_layout="n_quantizer")
        result = dst.load_state_dict(work, strict=True)
        diff = bit_diff(nq.weight_amax(), dst.weight_amax(), label="amax of expert")
        ok = written == sorted(upstream) and diff.equal
        sink.add(role, "state_dict/quantizer/upstream_keys", ok=ok,
                 expected=f"state dict writes exactly {upstream[0]} .. {upstream[-1]}; internal keys {internal[0]} .. load strictly, amax bitwise equal",
                 measured=f"wrote {written[:2]}..{written[-1:]}, load {result}, amax " + ("equal" if diff.equal else f"{diff.mismatches} differ"),
                 mismatches=diff.mismatches, detail=diff.summary())
    fwd = lambda m: outputs(m, bench.data, "all_routed")  # noqa: E731
    for check, src, dst in (
        ("state_dict/quantizer/load/n_to_vector", nq, _fresh(bench, device, per_expert=True, weight_layout="one_vector", vector_form="broadcast")),
        ("state_dict/quantizer/load/vector_to_n", bench.weight_models["one_vector_flat"], _fresh(bench, device, per_expert=True, weight_layout="n_quantizer")),
    ):
        with sink.guard(role, check):
            save_checkpoint(src.state_dict(), os.path.join(tmpdir, "quant.pt"))
            dst.load_state_dict(load_checkpoint(os.path.join(tmpdir, "quant.pt")), strict=True)
            diff = bit_diff(src.weight_amax() + [fwd(src)], dst.weight_amax() + [fwd(dst)], label="amax of expert / output #")
            sink.add_diff(role, check, diff, what="strict load; per-expert amax and outputs bitwise equal")
    with sink.guard(role, "state_dict/quantizer/shared_to_n_error"):
        shared_sd = dict(bench.weight_models["shared"].state_dict())
        try:
            vector_to_n(shared_sd, "", n, piece_ndim=nd)
            msg = ""
        except ValueError as exc:
            msg = str(exc)
        sink.add(role, "state_dict/quantizer/shared_to_n_error", ok="weight_quantizer._amax" in msg,
                 expected="ValueError naming 'weight_quantizer._amax'", measured=msg or "no error", detail=msg)
