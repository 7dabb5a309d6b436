"""Report row ``te_roles/grouped_linear_weight_per_gemm`` (MoE section, FP8 per-tensor benches):
Transformer Engine's role-addressed quantizers (``te_roles``) against the sequential per-expert
fake quant of a bench."""

from __future__ import annotations

from moe_fq_parity import reference
from moe_fq_parity.harness.core.equality import bit_diff

from .bench import Bench
from .compare import RowSink
from .roles import Role
from .te_roles import current_scaling_factory, num_quantizers, quantizer_roles, recipe_state_create


def te_role_rows(bench: Bench, sink: RowSink) -> None:
    """``te_roles/grouped_linear_weight_per_gemm`` (FP8 per-tensor benches): a TE grouped linear
    over the bench's N experts asks for N weight quantizers (one per GEMM, ``grouped_linear/weight``
    roles at slots 1, 4, ...); the current-scaling factory makes each E4M3 (variant ``te_current``),
    and that quantizer with each expert's own amax gives, bit for bit, the sequential per-expert
    fake-quantized weights (on calibrated weights, amax > 2**-24, ``te_current`` equals ``cuda``)."""
    spec = bench.sequential.weight_spec
    if spec.fmt != "fp8_e4m3" or spec.granularity != "per_tensor" or spec.variant not in (None, "cuda"):
        return
    role = Role("grouped_linear", "weight", bench.name)
    check = "te_roles/grouped_linear_weight_per_gemm"
    with sink.guard(role, check):
        n = bench.shape.num_experts
        roles = quantizer_roles("grouped_linear", bench.name, fwd=True, num_quantizers=num_quantizers("grouped_linear", True, n))
        slots = [i for i, r in enumerate(roles) if r == role.quantizer_role()]
        made = recipe_state_create(current_scaling_factory, [roles[i] for i in slots])
        problems = []
        if slots != [3 * g + 1 for g in range(n)]:
            problems.append(f"weight slots {slots}, expected one per GEMM at {[3 * g + 1 for g in range(n)]}")
        if {m.reference for m in made} != {("fp8_e4m3", "te_current")}:
            problems.append(f"factory gave {sorted({str(m) for m in made})}")
        amax = bench.sequential.weight_amax()
        te_fq = [reference.fake_quant(w, a, "fp8_e4m3", "te_current") for w, a in zip(bench.data.weights, amax)]
        diff = bit_diff(bench.quantized_weights(bench.sequential), te_fq, label="expert")
        small = [i for i, a in enumerate(amax) if float(a) <= 2.0**-24]
        sink.add(role, check, ok=not problems and diff.equal,
                 expected=f"{n} E4M3 weight quantizers (one per GEMM); per-expert te_current == sequential fake quant",
                 measured="; ".join(problems)
                 or ("equal" if diff.equal else f"{diff.mismatches}/{diff.numel} differ") + (f" (experts {small} amax <= 2^-24)" if small else ""),
                 mismatches=diff.mismatches, detail="; ".join(problems + [diff.summary()]))
