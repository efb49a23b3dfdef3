"""Internal API: gated RMSNorm: ``rules`` (its declaration, XLA formulas, derived rules and the
public function)."""
