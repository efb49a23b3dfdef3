"""Internal API: what the Flax layers of :mod:`jaxnorm.nnx` and :mod:`jaxnorm.linen` share and
the layer classes defined outside those two modules (``common``: the layers' calls into the
ops; ``nnx_pointwise`` / ``linen_pointwise``: the layers of the pointwise ops, built from their
entries of ``jaxnorm.OPS``; ``gated_nnx`` / ``gated_linen``: GatedRMSNorm).
The public homes are :mod:`jaxnorm.nnx` and :mod:`jaxnorm.linen`."""
