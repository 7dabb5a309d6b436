"""State-dict layout checks: indexed <-> grouped parameters and N-quantizer <-> one-vector amax.

Parameter rows (role ``grouped_linear/weight/{name}``, format-independent):

* ``state_dict/roundtrip/{stacked,packed}`` -- indexed -> grouped (``[N,out,in]`` / ``[N*out,in]``,
  biases ``[N,out]`` / ``[N*out]``) -> indexed: every key back, every tensor bit for bit;
* ``state_dict/load/{indexed_to_single,single_to_indexed}`` -- a checkpoint file of one layout
  (``torch.save``; read back with ``weights_only=True``) loaded strictly into a twin of the other
  layout through its pre-hook; unquantized outputs bitwise equal;
* ``state_dict/early_return/{target_present,incomplete,bias_absent}`` -- nothing touched;
* ``state_dict/early_return/grouped_beside_partial_indexed`` -- an indexed module's pre-hook given
  ``{weight, weight0}`` leaves both alone (*any* indexed key blocks the split; splitting would
  overwrite ``weight0``); the load then reports ``weight`` unexpected and ``weight1..`` missing;
* ``state_dict/early_return/bias_unused`` -- bias-free modules (indexed and single-grouped) convert
  the weight keys of a biased checkpoint and leave its ``bias``/``bias{i}`` keys alone (reported
  unexpected); weights loaded through the hook give the same outputs;
* ``state_dict/optimizer/{indexed_to_single,single_to_indexed}`` -- the optimizer-side
  normalisation of fp32 main params by name (``normalize_flat_grouped_params``, wrapper prefix
  ``module.`` on the model side) gives exactly the target's keys and bits;
* ``state_dict/optimizer/early_return/{grouped_beside_partial_indexed,bias_unused}`` -- the same
  two early returns on that path;
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

from moe_fq_parity.harness.core.equality import BitDiff, bit_diff

from .bench import Bench, outputs
from .compare import RowSink
from .data import ExpertData, ExpertShape
from .layers import GroupedLinearTwin, set_expert_params
from .quantized import QuantGroupedExperts, set_quant_mode
from .roles import Role
from .state_dict import (
    grouped_to_indexed, indexed_to_grouped, load_checkpoint, n_quantizer_keys, n_to_vector, normalize_flat_grouped_params,
    save_checkpoint, vector_to_n,
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
    _load_check(sink, role, "state_dict/load/indexed_to_single", indexed, _twin(shape, data, device, single=True, bias=True),
                os.path.join(tmpdir, "indexed.pt"), fwd)
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
    _early_return_rows(shape, data, sd, sink, role, device, fwd)
    _optimizer_rows(shape, data, sink, role, device)
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


def _hook(module: torch.nn.Module, sd: dict) -> dict:
    """Run ``module``'s load pre-hooks on a copy of ``sd`` (what ``load_state_dict`` hands them)."""
    work = dict(sd)
    for hook in module._load_state_dict_pre_hooks.values():
        hook(work, "", {}, True, [], [], [])
    return work


def _same_objects(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k] is b[k] for k in a)


def _early_return_rows(shape: ExpertShape, data: ExpertData, sd: dict, sink: RowSink, role: Role, device: torch.device, fwd) -> None:
    """The load pre-hook's early returns on partial and bias-free key sets (see module docstring)."""
    n = shape.num_experts
    check = "state_dict/early_return/grouped_beside_partial_indexed"
    with sink.guard(role, check):
        mixed = {"weight": torch.stack([sd[f"weight{i}"] for i in range(n)]), "weight0": -sd["weight0"]}
        target = _twin(shape, data, device, single=False, bias=False)
        after = _hook(target, mixed)
        result = _twin(shape, data, device, single=False, bias=False).load_state_dict(dict(mixed), strict=False)
        ok = _same_objects(mixed, after) and sorted(result.unexpected_keys) == ["weight"] and len(result.missing_keys) == n - 1
        sink.add(role, check, ok=ok, expected="hook leaves {weight, weight0} untouched (an indexed key blocks the split); "
                 f"load reports 'weight' unexpected and weight1..{n - 1} missing",
                 measured=f"keys after hook {sorted(after)}, untouched={_same_objects(mixed, after)}, unexpected {result.unexpected_keys}, "
                 f"{len(result.missing_keys)} missing")
    check = "state_dict/early_return/bias_unused"
    with sink.guard(role, check):
        with_bias = {k: v for k, v in sd.items()}
        grouped = dict(with_bias)
        indexed_to_grouped(grouped, "", "weight", n)
        indexed_to_grouped(grouped, "", "bias", n)
        problems = []
        for single, src in ((False, grouped), (True, with_bias)):
            target = _twin(shape, data, device, single=single, bias=False)
            after = _hook(target, src)
            bias_keys = sorted(k for k in src if k.startswith("bias"))
            kept = sorted(k for k in after if k.startswith("bias"))
            if kept != bias_keys or any(after[k] is not src[k] for k in kept):
                problems.append(f"{'single' if single else 'indexed'} bias-free module rewrote bias keys {bias_keys} -> {kept}")
            result = _twin(shape, data, device, single=single, bias=False).load_state_dict(dict(src), strict=False)
            if sorted(result.unexpected_keys) != bias_keys or result.missing_keys:
                problems.append(f"{'single' if single else 'indexed'}: unexpected {result.unexpected_keys}, missing {result.missing_keys}")
            elif not bit_diff([fwd(_twin(shape, data, device, single=False, bias=False))], [fwd(_loaded(target, src))], label="output").equal:
                problems.append(f"{'single' if single else 'indexed'}: weights loaded through the hook differ")
        sink.add(role, check, ok=not problems,
                 expected="bias-free modules convert weight keys and leave every bias key of a biased checkpoint alone (reported unexpected)",
                 measured="; ".join(problems) or "bias keys untouched in both directions", detail="; ".join(problems))


def _loaded(module: torch.nn.Module, sd: dict) -> torch.nn.Module:
    module.load_state_dict(dict(sd), strict=False)
    return module


class _Chunk(torch.nn.Module):
    """A model chunk as the optimizer sees it: ``module.decoder.experts.linear_fc1`` (DDP-style wrapper)."""

    def __init__(self, linear: torch.nn.Module) -> None:
        super().__init__()
        inner, decoder, experts = torch.nn.Module(), torch.nn.Module(), torch.nn.Module()
        experts.add_module("linear_fc1", linear)
        decoder.add_module("experts", experts)
        inner.add_module("decoder", decoder)
        self.add_module("module", inner)


def _main_params(chunk: torch.nn.Module) -> dict[str, torch.Tensor]:
    """fp32 main params by name, as the optimizer loads them (wrapper prefix dropped, checkpoint style)."""
    return {k[len("module."):]: v.detach().float() for k, v in chunk.named_parameters()}


def _optimizer_rows(shape: ExpertShape, data: ExpertData, sink: RowSink, role: Role, device: torch.device) -> None:
    """Optimizer-side normalisation rows (``normalize_flat_grouped_params``; see module docstring)."""
    for src_single, check in ((False, "state_dict/optimizer/indexed_to_single"), (True, "state_dict/optimizer/single_to_indexed")):
        with sink.guard(role, check):
            src = _Chunk(_twin(shape, data, device, single=src_single, bias=True))
            dst = _Chunk(_twin(shape, data, device, single=not src_single, bias=True))
            flat = _main_params(src)
            acts = normalize_flat_grouped_params(flat, dst)
            want = {k[len("module."):]: v.detach().float() for k, v in dst.named_parameters()}
            diff = dict_diff(want, flat)
            ok = diff.equal and sorted(acts.values()) == ["converted", "converted"]
            sink.add(role, check, ok=ok, expected="converted x2 (weight, bias); keys and fp32 bits of the target's params",
                     measured=f"{acts}, " + ("equal" if diff.equal else f"{diff.mismatches} differ"), mismatches=diff.mismatches, detail=diff.summary())
    check = "state_dict/optimizer/early_return/grouped_beside_partial_indexed"
    with sink.guard(role, check):
        flat = _main_params(_Chunk(_twin(shape, data, device, single=True, bias=True)))
        one = _main_params(_Chunk(_twin(shape, data, device, single=False, bias=True)))
        flat["decoder.experts.linear_fc1.weight0"] = -one["decoder.experts.linear_fc1.weight0"]
        weights = lambda d: {k: v for k, v in d.items() if ".weight" in k}  # noqa: E731
        before = weights(flat)
        acts = normalize_flat_grouped_params(flat, _Chunk(_twin(shape, data, device, single=False, bias=True)))
        same = _same_objects(before, weights(flat))
        ok = same and acts.get("decoder.experts.linear_fc1/weight") == "target_present"
        sink.add(role, check, ok=ok, expected="weight: target_present (an indexed key blocks the split); weight keys untouched",
                 measured=f"{acts}, weight keys untouched={same}")
    check = "state_dict/optimizer/early_return/bias_unused"
    with sink.guard(role, check):
        problems = []
        for src_single in (False, True):
            flat = _main_params(_Chunk(_twin(shape, data, device, single=src_single, bias=True)))
            biases = {k: v for k, v in flat.items() if ".bias" in k}
            acts = normalize_flat_grouped_params(flat, _Chunk(_twin(shape, data, device, single=not src_single, bias=False)))
            if {k: v for k, v in flat.items() if ".bias" in k}.keys() != biases.keys() or any(flat[k] is not v for k, v in biases.items()):
                problems.append(f"{'single' if src_single else 'indexed'} checkpoint: bias keys rewritten for a bias-free module ({acts})")
            if any(t.endswith("/bias") for t in acts):
                problems.append(f"bias considered for a bias-free module: {acts}")
        sink.add(role, check, ok=not problems, expected="bias-free modules: bias keys untouched, bias never considered",
                 measured="; ".join(problems) or "untouched in both directions", detail="; ".join(problems))


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
