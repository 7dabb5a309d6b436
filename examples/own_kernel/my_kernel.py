"""A backend for the parity harness in 20 lines: INT8 per-expert fake quant in plain torch."""

import torch


class MyInt8:
    name = "my-int8"
    formats = {"int8"}  # the other formats' cases are not applicable: not run, counted in one line
    variants = {"int8": ("cuda",)}  # the reference variant it implements: Model-Optimizer's CUDA formula
    options = {"int8": {}}  # no option (narrow range, unsigned): those cases are not applicable either
    device = "cpu"

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        out = []
        for x, a in zip(weights, amax):
            a = a.reshape(-1, 1) if a.dim() else a  # per channel [out] or per expert []
            s = torch.full_like(a, 127.0) / a  # s = RN(127 / amax), a true division
            q = torch.clamp(torch.round(x.float() * s), -128, 127)  # round half to even
            y = torch.where(a < 2.0**-24, torch.zeros_like(q), q / s)  # tiny amax -> +0
            out.append(y.to(x.dtype))
        return out
