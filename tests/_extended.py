"""The extended batteries: tests the default run (the README's ``pytest -n 2``) leaves out and CI
runs as a second step (``pytest -n 2 -m extended``, ``.ci/run``).

Each entry is a test id where ``*`` matches any text (the only wildcard). What goes here is more of what the default run
already checks, never the only check of a behaviour: another dtype, variant or size of a battery
whose first case stays in the default run, a second mutant family, a committed report beside the
one rendered by default, the maintainers' recipe rehearsals. The conftest marks every match
``extended`` (pyproject.toml's ``addopts`` deselects them by default) and fails the collection
of a file where a pattern here matches nothing, so the list cannot go stale silently. Chosen by
their time in the suite (``pytest --durations=0``; docs/perf-notes.md, "Test-suite time").
"""

EXTENDED = (
    # memory_efficient=True: float32 and float64 of every op, placement and centring; the
    # float64 grid and one float32 case stay in the default run.
    "tests/jaxnorm/test_memory_efficient.py::test_rule_matches_autodiff[True-*-float32-*]",
    "tests/jaxnorm/test_memory_efficient.py::test_rule_matches_autodiff[False-*-float32-layer_norm]",
    "tests/jaxnorm/test_memory_efficient.py::test_rule_matches_autodiff[False-outside-float32-rms_norm]",
    # The maintainer's recipe for a new op, rehearsed end to end (docs/adding-an-op.md).
    "tests/jaxnorm/test_throwaway_op.py::*",
    # The TPU kernels through the kit (value, VJP, JVP, second order); the float64-oracle
    # battery, the range rules and the exports stay in the default run.
    "tests/jaxnorm/test_tpu_kernels.py::test_kit_*",
    "tests/jaxnorm/test_tpu_kernels.py::test_gated_rms_norm_kit*",
    # The kit on correct functions: log_softmax (the one that had false rejects) stays.
    "tests/jaxnorm/test_kit_no_false_reject.py::test_no_reject_of_a_correct_function[softmax]",
    "tests/jaxnorm/test_kit_no_false_reject.py::test_no_reject_of_a_correct_function[logsumexp]",
    "tests/jaxnorm/test_kit_no_false_reject.py::test_no_reject_of_a_correct_function[standardize]",
    # The committed reports rendered from their raw data: the cpu report stays.
    "tests/experiments/test_committed_reports.py::test_committed_report_is_its_raw_data_rendered[gpu]",
    "tests/experiments/test_committed_reports.py::test_committed_report_is_its_raw_data_rendered[cpu-*]",
    # Gated RMSNorm: the float32 eager case with a 4-group scale stays.
    "tests/jaxnorm/test_gated.py::test_rules_equal_float64_autodiff[float32-None-True-*",
    "tests/jaxnorm/test_gated.py::test_rules_equal_float64_autodiff[float32-8-True-*",
    "tests/jaxnorm/test_gated.py::test_rules_without_a_scale*",
    # DyT / Derf: the bfloat16 and float16 cases and the models stay.
    "tests/jaxnorm/test_pointwise.py::test_rules_over_input_scales",
    "tests/jaxnorm/test_pointwise.py::test_rules_equal_float64_autodiff[float32-head-*",
    # Per-head parameters through the kit on XLA (the kernels' case and the layers stay).
    "tests/jaxnorm/test_per_head.py::test_per_head_value_vjp_jvp[xla]",
    # Second order on hard rows (second order itself, in every dtype, stays).
    "tests/jaxnorm/test_ops_transforms.py::test_second_order_with_an_outlier_first_feature",
    "tests/jaxnorm/test_ops_transforms.py::test_second_order_with_epsilon_outside_on_tiny_rows*",
    # Forward mode: Hessian-vector products of the model, full Jacobians.
    "tests/jaxnorm/test_forward_mode.py::test_hessian_vector_product_both_ways*",
    "tests/jaxnorm/test_forward_mode.py::test_jacfwd_equals_jacrev_and_explicit_jacobian*",
    # The fused add + norm's kit battery on XLA and the kernels (its variant grid stays).
    "tests/jaxnorm/test_fused.py::TestXla::test_rule_matches_float64_reference",
    "tests/jaxnorm/test_fused.py::TestPallas::test_rule_matches_float64_reference",
    "tests/jaxnorm/test_fused.py::test_grad_of_grad",
    # Training harness: two processes, init instrumentation.
    "tests/experiments/test_train.py::test_two_process_run_matches_single_process",
    "tests/experiments/test_train.py::test_init_instrumentation",
    # The kit's own checks: every transform on one case (each transform stays, on the mutants).
    "tests/jaxnorm/test_testing_kit.py::test_every_transform_on_one_case",
    # LayerNorm's fast variance: the derived rules with the plain formula (the other stays).
    "tests/jaxnorm/test_fast_variance.py::test_derived_rules_match_autodiff_of_the_fast_formula[False]",
    # Scan against unrolled, and the theory variants, for one configuration each.
    "tests/jaxnorm/test_models.py::test_scan_matches_unrolled[pre-layer_norm-jaxnorm]",
    "tests/jaxnorm/test_models.py::test_theory_variant_options",
    # Second round (the clean clone's default run took 7 min 35 s of pytest after the first):
    # DyT / Derf in float32 eagerly (their bfloat16 and float16 cases stay).
    "tests/jaxnorm/test_pointwise.py::test_rules_equal_float64_autodiff[float32-scalar-*",
    # Scan against unrolled with the fused carried add (post and deepnorm stay).
    "tests/jaxnorm/test_models.py::test_scan_matches_unrolled[sandwich-rms_norm-jaxnorm]",
    # Fully sharded training (data-parallel stays).
    "tests/experiments/test_train.py::test_sharded_matches_single_device[True]",
    # Per-head parameters through the kit on the kernels (the layers' per-head tests stay).
    "tests/jaxnorm/test_per_head.py::test_per_head_value_vjp_jvp[pallas]",
    # Two of the kit's mutant families (the other mutants stay).
    "tests/jaxnorm/test_testing_kit.py::test_rejects_every_mutant[softplus_naive_sigmoid]",
    "tests/jaxnorm/test_testing_kit.py::test_rejects_every_mutant[gelu_erf_backward]",
    # Features split over a vmap axis with a per-slice scale (the shared scale stays).
    "tests/jaxnorm/test_one_ad_layer.py::test_features_split_over_a_vmap_axis[layer_norm-per-slice]",
    # Second order in bfloat16 for LayerNorm (float16 and the other ops stay).
    "tests/jaxnorm/test_ops_transforms.py::test_second_order_in_16_bits[layer_norm-bfloat16]",
    # Third round (2,450 tests, the clean clone's default run 8 min 35 s of pytest):
    # the gated kernels against the oracle, seven of ten random configurations (blk0-blk2 stay).
    "tests/jaxnorm/test_gated_kernel.py::test_kernels_match_oracle[*-blk3]",
    "tests/jaxnorm/test_gated_kernel.py::test_kernels_match_oracle[*-blk4]",
    "tests/jaxnorm/test_gated_kernel.py::test_kernels_match_oracle[*-blk5]",
    "tests/jaxnorm/test_gated_kernel.py::test_kernels_match_oracle[*-blk6]",
    "tests/jaxnorm/test_gated_kernel.py::test_kernels_match_oracle[*-blk7]",
    "tests/jaxnorm/test_gated_kernel.py::test_kernels_match_oracle[*-blk8]",
    "tests/jaxnorm/test_gated_kernel.py::test_kernels_match_oracle[*-blk9]",
    # The TPU kernels against the float64 oracle in bfloat16 (the float32 cases stay).
    "tests/jaxnorm/test_tpu_kernels.py::test_plain_op_matches_the_float64_oracle[*-bfloat16-*]",
    # Fused against unfused models: sandwich, deepnorm and Post-LN LayerNorm (pre-layer_norm and
    # post-rms_norm stay).
    "tests/jaxnorm/test_fused_modules.py::test_fused_and_unfused_models_train_alike[sandwich-*]",
    "tests/jaxnorm/test_fused_modules.py::test_fused_and_unfused_models_train_alike[deepnorm-*]",
    "tests/jaxnorm/test_fused_modules.py::test_fused_and_unfused_models_train_alike[post-layer_norm]",
    # The JVP against the reference: the outside and zero-centred variants, and RMSNorm's mask
    # (both ops' defaults and LayerNorm's mask stay).
    "tests/jaxnorm/test_forward_mode.py::test_jvp_matches_reference[*-outside]",
    "tests/jaxnorm/test_forward_mode.py::test_jvp_matches_reference[*-zero_centered]",
    "tests/jaxnorm/test_forward_mode.py::test_jvp_matches_reference[rms_norm-mask]",
    # Batched parameters through the backward kernels: the llama and zero-centred casting
    # variants (every op's plain case stays).
    "tests/jaxnorm/test_one_ad_layer.py::test_batched_parameters_run_the_backward_kernels[*-llama]",
    "tests/jaxnorm/test_one_ad_layer.py::test_batched_parameters_run_the_backward_kernels[*-zc-outside]",
    # Fourth round (2,445 tests; the working tree's default run 7 min 26 s of pytest, a clean clone's
    # 7 min 12 s, issue 62's 7-minute goal). Scan against unrolled with Flax's norms (DeepNorm with
    # jaxnorm's stays, and so does the carried Pre-LN scan against unrolled with QK-norm,
    # test_qk_norm_model.py::test_scan_matches_unrolled_with_qk_norm_and_norm_scaling[pre-True]).
    "tests/jaxnorm/test_models.py::test_scan_matches_unrolled[post-rms_norm-flax]",
    # The TPU kernels against the float64 oracle: LayerNorm with 8-row blocks on unpadded rows (its
    # padded 8-row block and default blocks stay; RMSNorm's cases stay).
    "tests/jaxnorm/test_tpu_kernels.py::test_plain_op_matches_the_float64_oracle[layer_norm-37x300-float32-br8-]",
    # One more kit mutant family (six stay; a zero in the oracle keeps its own default test).
    "tests/jaxnorm/test_testing_kit.py::test_rejects_every_mutant[hessian_off_at_zero]",
    # Training: the sandwich and DeepNorm layouts (Pre-LN and Post-LN stay).
    "tests/experiments/test_train.py::test_each_layout_trains[sandwich-rms_norm]",
    "tests/experiments/test_train.py::test_each_layout_trains[deepnorm-layer_norm]",
    # The fused kernels against the reference: RMSNorm's wide bfloat16 row (LayerNorm's wide row,
    # 9x96, the float16 case and the zero-centred 5x7 case stay), and RMSNorm's float32 stream
    # under bfloat16 activations on XLA (LayerNorm's stays).
    "tests/jaxnorm/test_fused.py::test_pallas_kernels_match_reference[rms_norm-12x8200-bfloat16-None]",
    "tests/jaxnorm/test_fused.py::TestXla::test_float32_stream_under_bfloat16_activations[rms_norm]",
    # memory_efficient=True without a scale or per head, and in bfloat16, for RMSNorm
    # (LayerNorm's stay).
    "tests/jaxnorm/test_memory_efficient.py::test_without_scale_and_per_head_scale[rms_norm]",
    "tests/jaxnorm/test_memory_efficient.py::test_bfloat16_within_the_budget_of_a_rounded_y[rms_norm]",
    # Linen parity with 16-bit parameters for LayerNorm (float32 parameters, and RMSNorm's
    # 16-bit ones, stay; the NNX grid stays whole).
    "tests/jaxnorm/test_linen.py::test_parity_with_flax[LayerNorm-*-pfloat16-*]",
    # Batched parameters through the derived backward in the llama casting (plain and t5 stay).
    "tests/jaxnorm/test_one_ad_layer.py::test_batched_parameters_run_the_derived_backward_xla[*-llama]",
)
