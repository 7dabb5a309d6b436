"""Distributed checkpoints of per-expert quantizer state across TP/EP layouts.

Real ranks (gloo on the CPU, NCCL on GPUs) save a small MoE expert model with its quantizer
buffers under one (TP, EP) layout and load it under another; the parent process checks every
expert's amax, weight and fake-quantized weight against a single-process copy of the checkpoint
and against the model computed at TP=1/EP=1.

Modules, bottom up:

* ``layout``     -- ``Layout(tp, ep)``, Megatron's rank order and global expert index;
* ``model``      -- the expert model (fc1 column parallel, fc2 row parallel), seeded per expert;
* ``quant``      -- formats as buffers, max calibration, the TP sync step, fake quant (reference);
* ``shards``     -- checkpoint keys (N-quantizer / one-vector; global or buggy local index),
  ``ShardSpec`` pieces and the canonical ``LocalState``;
* ``safe_io``    -- allow-listed DCP metadata, tensors only, clear errors; single-process load;
* ``launch``     -- ``run_ranks``: processes, process groups, device mesh, deadlines, results;
* ``engines``    -- DCP (DTensor) and optional Megatron-Core engines; ``load_checked``;
* ``jobs``       -- what ranks run: one save job per save layout, one load job per load layout;
* ``oracle``     -- the TP=1/EP=1 truth and what a correct checkpoint holds;
* ``checks``     -- bitwise diffs, assembly of pieces, the ``Verdict`` row constructor (a ``SectionRow``);
* ``judge``      -- rank reports -> verdicts (round trip, invariance, bad input);
* ``bad_inputs`` -- checkpoints that must be refused;
* ``matrix``     -- ``DistPlan`` and ``run_plan``: the stages end to end;
* ``section``    -- the report section ``dist``; ``__main__`` -- ``python -m moe_fq_parity.harness.sections.checkpoint``.

Which rows check which upstream change: ``docs/seed-changes.md``.
"""
