"""Internal API: jaxnorm's ops by family, above the backends they run on.

* :mod:`jaxnorm.ops.table`: :data:`jaxnorm.OPS`, the one list of ops, and ``lookup``;
* :mod:`jaxnorm.ops.norm`: LayerNorm and RMSNorm (and their residual add + norm): argument
  preparation, the derived rules on the rule factory, the public functions, the Jacobians and the
  memory-saving backward;
* :mod:`jaxnorm.ops.pointwise`: DyT and Derf;
* :mod:`jaxnorm.ops.gated`: gated RMSNorm.

The public names are ``jaxnorm.<op>``; import paths inside this package may change. The
declarations the backends read (:mod:`jaxnorm._norm_ops`, :mod:`jaxnorm._norm_config`) and the
rule factory (:mod:`jaxnorm._rules`) sit below the backends, at the package's root.
"""
