"""The verdict rules of the gradient-norm study (:mod:`experiments.studies.grad_init`).

Every rule takes the study's analysis (:func:`experiments.studies.grad_init.analyse`: ratios, slopes
and residual levels, plain numbers) and returns a claim dict (``id``, ``criterion``, ``ours``,
``holds``); none measures anything, so ``tests/experiments/test_verdicts.py`` feeds each one synthetic results
for yes, partly and no. The criteria are the same for every preset. The two seed-dependent verdicts
(growth and slope) on fewer than :data:`FIRM_SEEDS` seeds are marked thin in their text and their
``seeds`` entry (the report's seed column), naming where the seeds disagree (issue 50).
"""

from __future__ import annotations

from typing import Protocol

from experiments.suite import claims as claims_lib


class Design(Protocol):
  """The sizes of the gradient-at-init study that the rules read: :class:`experiments.studies.grad_init.Config` is one
  (the rules do not import the study, which imports them)."""

  depths: tuple
  seeds: tuple
  norm_types: tuple
  small_init: bool
  theory: bool
  variant_depths: tuple | None


# Verdict criteria (the same for every preset).
GROWTH_FACTOR = 1.5          # Post-LN "grows" at a depth: its last/first ratio is at least this
FLAT_BAND = (1 / GROWTH_FACTOR, GROWTH_FACTOR)  # Pre-LN "about flat" (shown, not judged): its ratio in this band
SLOPE_POST_ABS = 0.25        # |log-log slope| within this counts as "independent of L"; below -this: decreasing
LEMMA2_INCREMENT = (0.5, 1.5)  # Lemma 2: E||x||^2/d grows by this much per whole Pre-LN layer
POST_LEVEL = (1.25, 1.75)    # "about 3/2" (Post-LN FFN norm inputs)
ATTN_LEVEL = (1.0, 2.0)      # Post-LN attention norm inputs with W^Q = W^K = 0
FIRM_SEEDS = 3               # fewer seeds: the growth and slope verdicts are marked thin (issue 50)


def _thin(cfg: Design, split: list[str]) -> tuple[str, str]:
  """``(prefix of ours, seeds column)`` of a seed-dependent verdict: with fewer than :data:`FIRM_SEEDS`
  seeds it is marked thin, naming where the seeds fall on both sides of a cut-off (``split``)."""
  seeds = list(cfg.seeds)
  if len(seeds) >= FIRM_SEEDS:
    return "", str(seeds)
  where = f", they disagree: {'; '.join(split)}" if split else ""
  return f"**thin: {len(seeds)} seeds**{where}. ", f"{seeds} (thin: fewer than {FIRM_SEEDS})"


def _fmt_ratio(x):
  return f"{x:z.2f}"


def _growth_claim(an: dict, cfg: Design) -> dict:
  """``xiong_grad_growth``, judged per (norm, depth) (see :func:`verdicts`)."""
  crit = (f"LayerNorm only (the claim's norm; RMSNorm shown beside, not judged), per depth: Post-LN's last/first W2 "
          f"ratio >= {GROWTH_FACTOR} (it grows) and Pre-LN's < {GROWTH_FACTOR} (it does not grow, as the claim says); "
          f"yes/partly/no = every/some/no depth; whether Pre-LN is about flat (in [{FLAT_BAND[0]:z.2f}, "
          f"{FLAT_BAND[1]:z.2f}], the paper's figure) or decays towards the output is stated beside, not judged; "
          "a ratio within 10% of a threshold is marked")
  if len(cfg.seeds) < 2 or len(cfg.depths) < 2 or max(cfg.depths) < 12:
    holds, ours = claims_lib.not_testable([f"needs >= 2 seeds and >= 2 depths, one >= 12; the preset has seeds "
                                           f"{list(cfg.seeds)}, depths {list(cfg.depths)}"])
    return {"id": "xiong_grad_growth", "criterion": crit, "ours": ours, "holds": holds}
  pairs, oks, pre_by_norm, split = [], [], {}, []
  for norm in cfg.norm_types:
    for L in cfg.depths:
      post = an["ratios"][f"xavier/post/{norm}/L{L}"]["mlp_out"]
      pre = an["ratios"][f"xavier/pre/{norm}/L{L}"]["mlp_out"]
      per = an["ratios"][f"xavier/post/{norm}/L{L}"].get("mlp_out_per_seed") or []
      if norm == "layer_norm" and len({v >= GROWTH_FACTOR for v in per}) > 1:
        split.append(f"Post-LN at L={L} per seed " + ", ".join(_fmt_ratio(v) for v in per))
      grows, pre_grows = post >= GROWTH_FACTOR, pre >= GROWTH_FACTOR
      if norm == "layer_norm":
        oks.append(grows and not pre_grows)
      pre_by_norm.setdefault(norm, []).append(pre)
      notes = ([] if grows else ["Post-LN does not grow"]) + (
          ["Pre-LN grows too"] if pre_grows else
          ["Pre-LN does not grow: it decays towards the output"] if pre < FLAT_BAND[0] else [])
      near = [x for x in (post, pre) for t in (GROWTH_FACTOR,) if abs(x - t) <= 0.1 * t]
      if near:
        notes.append("within 10% of a threshold")
      pairs.append(f"{'LN' if norm == 'layer_norm' else 'RMS (not judged)'} L={L}: {_fmt_ratio(post)} vs "
                   f"{_fmt_ratio(pre)}" + (f" ({'; '.join(notes)})" if notes else ""))
  lo, hi = min(cfg.depths), max(cfg.depths)
  trend = "; ".join(f"Pre-LN ({'LN' if n == 'layer_norm' else 'RMS'}) last/first {_fmt_ratio(v[0])} at L={lo} -> "
                    f"{_fmt_ratio(v[-1])} at L={hi}" for n, v in pre_by_norm.items() if len(v) > 1)
  thin, seeds = _thin(cfg, split)
  ln = ", ".join(f"L={L} {_fmt_ratio(an['ratios'][f'xavier/post/layer_norm/L{L}']['mlp_out'])} vs "
                 f"{_fmt_ratio(an['ratios'][f'xavier/pre/layer_norm/L{L}']['mlp_out'])}" for L in cfg.depths
                 if "layer_norm" in cfg.norm_types)
  return {"id": "xiong_grad_growth", "criterion": crit,
          "ours": thin + "last/first-layer W2 grad ratio, Post-LN vs Pre-LN (Xavier): " + "; ".join(pairs)
          + (f". {trend}" if trend else ""),
          "short": thin + f"last/first W2 ratio, Post-LN vs Pre-LN (LN, Xavier): {ln}",
          "holds": claims_lib.verdict(oks), "seeds": seeds}


def _scaling_claim(an: dict, cfg: Design) -> dict:
  """``xiong_grad_depth_scaling`` from the log-log slopes (see :func:`verdicts`)."""
  crit = (f"log-log slope of the last-layer W2 gradient norm vs L, LayerNorm only (RMSNorm shown beside, not judged): "
          f"Post-LN flat (|slope| <= {SLOPE_POST_ABS}), Pre-LN decreasing (slope < -{SLOPE_POST_ABS}, below the flat "
          "band); Theorem 1's bound decays like L^-1/2 (an upper bound, not a predicted slope); yes/partly/no = "
          "both/one/neither; each slope with its per-seed values, marked where a seed falls on the other side of "
          "the cut-off")
  ds = sorted(cfg.depths)
  if len(ds) < 3 or ds[-1] < 4 * ds[0] or len(cfg.seeds) < 2:
    holds, ours = claims_lib.not_testable([f"needs >= 3 depths spanning a factor >= 4 and >= 2 seeds; the preset "
                                           f"has depths {ds}, seeds {list(cfg.seeds)}"])
    return {"id": "xiong_grad_depth_scaling", "criterion": crit, "ours": ours, "holds": holds}
  parts, oks, split = [], [], []
  for norm in cfg.norm_types:
    spre, spost = an["slopes"][f"xavier/pre/{norm}"], an["slopes"][f"xavier/post/{norm}"]
    for name, d, ok in (("Post-LN", spost, lambda v: abs(v) <= SLOPE_POST_ABS),
                        ("Pre-LN", spre, lambda v: v < -SLOPE_POST_ABS)):
      per = d.get("slope_per_seed") or []
      if norm == "layer_norm" and len({ok(v) for v in per}) > 1:
        split.append(f"{name} slope per seed " + ", ".join(f"{v:+z.2f}" for v in per))
    sp, so = spre["slope"], spost["slope"]

    def seeds(d, ok):
      per = d.get("slope_per_seed") or []
      if not per:
        return ""
      split = len({ok(v) for v in per}) > 1
      return (" (per seed " + ", ".join(f"{v:+z.2f}" for v in per) + ")"
              + (" **seeds on both sides of the cut-off**" if split else ""))
    parts.append(f"{'LN' if norm == 'layer_norm' else 'RMS (not judged)'}: Post-LN {so:+z.2f}"
                 f"{seeds(spost, lambda v: abs(v) <= SLOPE_POST_ABS)}, Pre-LN {sp:+z.2f}"
                 f"{seeds(spre, lambda v: v < -SLOPE_POST_ABS)}")
    if norm == "layer_norm":
      oks += [abs(so) <= SLOPE_POST_ABS, sp < -SLOPE_POST_ABS]
  thin, seeds = _thin(cfg, split)
  ln = {k: an["slopes"].get(f"xavier/{k}/layer_norm", {}).get("slope") for k in ("post", "pre")}
  return {"id": "xiong_grad_depth_scaling", "criterion": crit,
          **({"short": thin + f"log-log slope of the last-layer W2 grad norm vs L (LN): Post-LN {ln['post']:+z.2f}, "
                              f"Pre-LN {ln['pre']:+z.2f}"} if None not in ln.values() else {}),
          "ours": thin + f"log-log slope of the last-layer W2 grad norm vs L ({min(cfg.depths)}-{max(cfg.depths)}): "
          + "; ".join(parts) + " (bound: -0.5 for Pre-LN)", "holds": claims_lib.verdict(oks), "seeds": seeds}


def verdicts(an: dict, cfg: Design) -> list[dict]:
  """The claims of the gradient-norm experiment, from the analysis ``an``.

  Ratios are last/first-layer ``mlp_out`` (W2) gradient-norm ratios; "yes/partly/no" means at
  every / some / no depth unless stated otherwise.

  * ``xiong_grad_growth`` (Xavier grid, :func:`_growth_claim`), per depth, LayerNorm: Post-LN's
    ratio is at least ``GROWTH_FACTOR`` (1.5: it grows) and Pre-LN's is below it (it does not grow,
    which is what the claim says; issue 44: a Pre-LN decay towards the output no longer counts
    against it, it is stated beside: "decays towards the output" below ``FLAT_BAND``, where the
    paper's figure shows it about flat); yes/partly/no = every/some/no depth. Not testable with
    fewer than 2 seeds or 2 depths, or no depth >= 12.
  * ``xiong_grad_depth_scaling`` (Xavier grid, :func:`_scaling_claim`): the log-log slope of the
    last-layer W2 gradient norm against L, per norm type: Post-LN's within +-``SLOPE_POST_ABS``
    (0.25, flat), Pre-LN's below -0.25 (decreasing); Theorem 1's O() terms are upper bounds, so
    the -1/2 of the Pre-LN bound is reported, not required. yes/partly/no = all/some/none of the
    checks; not testable with fewer than 3 depths spanning a factor 4, or fewer than 2 seeds.
  * ``xiong_lemma2_preln`` (:func:`_lemma2_claim`): Pre-LN's (LayerNorm; the theory variant if
    run, else Xavier) mean increase of ``E||x||^2/d`` across a whole layer in
    ``LEMMA2_INCREMENT`` [0.5, 1.5] (the lemma's band is per layer: the FFN adds 1/2 in
    expectation, attention 0..1), per variant depth; yes/partly/no = every/some/no depth.
  * ``xiong_lemma_postln`` (:func:`_lemma_postln_claim`): the mean ``E||x||^2/d`` of Post-LN's
    FFN norm inputs (same setting) in ``POST_LEVEL`` [1.25, 1.75] and every attention norm
    input in ``ATTN_LEVEL`` [1, 2] (± 0.05): yes if both at every depth, partly if either
    somewhere, no otherwise.
  * ``init_changes_picture`` (with ``small_init``, :func:`_init_claim`): the ratios under Xavier
    and small init, an observation (``"obs"``) without verdict.

  Args:
    an: the output of :func:`experiments.studies.grad_init.analyse`.
    cfg: the experiment's config.

  Returns:
    Claim dicts with ``id``, ``ours``, ``holds`` and, for some, ``note``.
  """
  setting = "theory" if cfg.theory else "xavier"
  vdepths = (cfg.variant_depths or cfg.depths) if setting == "theory" else cfg.depths
  claims = [_growth_claim(an, cfg), _scaling_claim(an, cfg), _lemma2_claim(an, setting, vdepths),
            _lemma_postln_claim(an, setting, vdepths)]
  if cfg.small_init:
    claims.append(_init_claim(an, cfg))
  return claims


def _lemma2_claim(an: dict, setting: str, vdepths) -> dict:
  """``xiong_lemma2_preln``: Pre-LN's per-layer increment of E||x||^2/d (see :func:`verdicts`)."""
  res = {L: an["residual"][f"{setting}/pre/layer_norm/L{L}"] for L in vdepths}
  inside = [LEMMA2_INCREMENT[0] <= r["mean_increment"] <= LEMMA2_INCREMENT[1] for r in res.values()]
  return {
      "id": "xiong_lemma2_preln",
      "criterion": f"{setting} variant, LayerNorm: the mean increase of E||x||^2/d across a whole layer (attention "
                   f"adds 0..1, the FFN 1/2 in expectation) is in {list(LEMMA2_INCREMENT)} at every depth; "
                   "yes/partly/no = every/some/no depth",
      "ours": "per layer: " + ", ".join(
          f"L={L}: {r['mean_increment']:z.2f} ({100 * r['frac_layers_in_bounds']:z.0f}% of layers in bounds)"
          for L, r in res.items())
      + "; of which attention " + ", ".join(f"L={L}: {r['mean_attn_increment']:z.2f}" for L, r in res.items())
      + ", FFN " + ", ".join(f"L={L}: {r['mean_ffn_increment']:z.2f}" for L, r in res.items()),
      "holds": claims_lib.verdict(inside),
  }


def _lemma_postln_claim(an: dict, setting: str, vdepths) -> dict:
  """``xiong_lemma_postln``: Post-LN's FFN and attention norm-input levels (see :func:`verdicts`)."""
  post = {L: an["residual"][f"{setting}/post/layer_norm/L{L}"] for L in vdepths}
  ffn_ok = [POST_LEVEL[0] <= r["ffn_mean"] <= POST_LEVEL[1] for r in post.values()]
  attn_ok = [ATTN_LEVEL[0] - 0.05 <= r["attn_min"] and r["attn_max"] <= ATTN_LEVEL[1] + 0.05 for r in post.values()]
  return {
      "id": "xiong_lemma_postln",
      "criterion": f"{setting} variant, LayerNorm: the mean E||x||^2/d of Post-LN's FFN norm inputs is in "
                   f"{list(POST_LEVEL)} and every attention norm input in {list(ATTN_LEVEL)} (± 0.05) at every depth",
      "ours": "FFN norm inputs: " + ", ".join(f"L={L}: {r['ffn_mean']:z.2f}" for L, r in post.items())
      + "; attention norm inputs: " + ", ".join(f"L={L}: {r['attn_min']:z.2f}-{r['attn_max']:z.2f}"
                                                 for L, r in post.items()),
      "holds": "yes" if all(ffn_ok) and all(attn_ok) else ("partly" if any(ffn_ok) or any(attn_ok) else "no"),
  }


def _init_claim(an: dict, cfg: Design) -> dict:
  """``init_changes_picture``: Xavier vs small init ratios, an observation (see :func:`verdicts`)."""
  parts = []
  for L in (cfg.variant_depths or cfg.depths):
    px = an["ratios"].get(f"xavier/post/layer_norm/L{L}", {}).get("mlp_out", float("nan"))
    ps = an["ratios"][f"small/post/layer_norm/L{L}"]["mlp_out"]
    rx = an["ratios"].get(f"xavier/pre/layer_norm/L{L}", {}).get("mlp_out", float("nan"))
    rs = an["ratios"][f"small/pre/layer_norm/L{L}"]["mlp_out"]
    parts.append(f"L={L}: Post-LN {px:z.2f} (Xavier) -> {ps:z.2f} (small), Pre-LN {rx:z.2f} -> {rs:z.2f}")
  return {"id": "init_changes_picture", "ours": "last/first W2 ratio; " + "; ".join(parts), "holds": "obs"}
