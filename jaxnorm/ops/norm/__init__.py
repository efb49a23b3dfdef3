"""Internal API: the norm family (LayerNorm, RMSNorm, their residual add + norm).

``args`` (checks and the call's config), ``rules`` (the family's declaration for the rule
factory and its ``custom_jvp`` ops), ``layer_norm`` / ``rms_norm`` / ``add_norm`` (the public
functions), ``jacobian`` (explicit Jacobians), ``memory_efficient`` (the memory-saving backward).
"""
