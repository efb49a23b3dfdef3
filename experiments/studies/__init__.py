"""The studies of the Pre-/Post-Norm report, one module per question (config, run, plot, verdicts).

Each module follows the protocol of :mod:`experiments.suite.study`; the runner finds them through
:data:`experiments.suite.registry.EXPERIMENTS`.
"""
