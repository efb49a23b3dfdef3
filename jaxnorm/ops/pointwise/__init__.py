"""Internal API: the pointwise family (DyT, Derf): ``rules`` (declarations, formulas and the
derived rules) and ``api`` (the public functions)."""
