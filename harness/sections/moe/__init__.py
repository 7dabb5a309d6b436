"""MoE calibration semantics: grouped (Transformer Engine) vs sequential experts.

Module map:

* ``roles``       -- ``Role(module_type, tensor_type, name)``, ``QuantSpec``, ``Recipe``;
* ``layers``      -- ``GroupedLinearTwin`` (TE ``GroupedLinear`` in pure torch), ``SequentialExperts``;
* ``te_adapter``  -- ``make_grouped_linear`` (real TE when it runs here, else the twin), ``grouped_forward``;
* ``quantizers``  -- ``MaxQuantizer`` / ``ExpertQuantizer`` with ``_amax`` buffers, layouts, STE;
* ``quantized``   -- ``QuantGroupedExperts``, ``QuantSequentialExperts``, ``calibrate``;
* ``state_dict``  -- indexed <-> grouped parameter keys, N-quantizer <-> one-vector amax;
* ``data``        -- seeded expert weights and routed tokens whose per-expert amax differ;
* ``bench``       -- the calibrated models one role's checks compare;
* ``compare``     -- bitwise list comparison and the row collector;
* ``checks_weight`` / ``checks_input`` / ``checks_state`` / ``checks_loss`` -- the report rows;
* ``upstream_hook`` -- Megatron's grouped-key hook as a backend beside ours (where it imports);
* ``te_roles``    -- Transformer Engine's ``QuantizerRole``, slot order and role-addressed factories;
* ``section``     -- ``run(suite, seed, device) -> Section`` (``python -m moe_fq_parity.harness.sections.moe`` runs it).

Which rows check which upstream change: ``docs/seed-changes.md``.
"""
