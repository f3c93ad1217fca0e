"""The statistics every seed-paper table uses: mean ± SD, pooled SD, Welch's t, Holm, chance, linear fits.

One home, so that "pooled SD", "p" and "reproduced" mean the same thing in every table of ``results/reference``:

* :func:`mean_sd` / :func:`fmt_mean_sd`: sample mean and sample SD (ddof = 1) over seeds, "m ± s (n=k)";
* :func:`pooled_sd`: the within-group pooled SD √(Σ(nᵢ−1)sᵢ² / Σ(nᵢ−1)) (not the SD of all values
  together, which adds the difference between the groups to the spread);
* :func:`welch`: Welch's two-sample t-test (unequal variances, Welch–Satterthwaite df) with the confidence
  interval of the difference of means;
* :func:`holm`, :func:`bonferroni`: family-wise corrections of p-values, needed whenever a best-of choice
  (e.g. the best of three budget splits) or several comparisons are made on the same data;
* :func:`verdict`, :func:`compare`: the two-sided rule: "reproduced" when the (corrected, two-sided) test rejects
  in the paper's direction, "not reproduced" when it rejects in the other, "inconclusive" otherwise;
* :func:`tost`, :func:`equivalence_verdict`, :func:`all_equivalent`: where a paper claims *sameness* (two
  settings give near-identical results), a difference test that fails to reject proves nothing. Two one-sided
  tests (Schuirmann 1987) against a stated margin δ: "reproduced" (equivalent) when the 1 − 2α interval of the
  difference lies inside (−δ, δ), "not reproduced" when the difference is shown to exceed δ (a one-sided test
  of |diff| > δ rejects), "inconclusive" otherwise;
* :func:`chance_test`: accuracy against chance (binomial), to flag arms that learned next to nothing;
* :func:`linear_fit`: least squares with its degrees of freedom, R² and the slope's standard error.

>>> round(pooled_sd([22.0, 23.0, 22.7], [21.4, 22.0, 19.7]), 2)  # the issue's example: not 1.2
0.92
>>> holm([0.01, 0.04, 0.03])
[0.03, 0.06, 0.06]
>>> verdict(diff=+1.5, p=0.01), verdict(diff=+1.5, p=0.2), verdict(diff=-1.5, p=0.01)
('reproduced', 'inconclusive', 'not reproduced')
>>> r = tost([1.00, 1.01, 0.99, 1.00], [1.00, 0.99, 1.01, 1.01], margin=0.05)
>>> equivalence_verdict(r), round(r.diff, 4)
('reproduced', -0.0025)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["ALPHA", "mean_sd", "fmt_mean_sd", "fmt_p", "pooled_sd", "WelchResult", "welch", "welch_from_summary",
           "holm", "bonferroni", "verdict", "Comparison", "compare", "EquivalenceResult", "tost",
           "tost_from_summary", "equivalence_verdict", "all_equivalent", "mean_ci", "ChanceResult", "chance_test", "LinearFit", "linear_fit"]

#: the significance level of every verdict in the seed-paper tables
ALPHA = 0.05


def _finite(values: Sequence[float | None]) -> np.ndarray:
    return np.asarray([float(v) for v in values if v is not None and math.isfinite(float(v))], dtype=np.float64)


def mean_sd(values: Sequence[float | None]) -> tuple[float, float, int]:
    """(mean, sample SD with ddof = 1, n) of the finite values; SD is nan for n < 2, both nan for n = 0."""
    v = _finite(values)
    if v.size == 0:
        return float("nan"), float("nan"), 0
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else float("nan"), int(v.size)


def fmt_mean_sd(values: Sequence[float | None], fmt: str = ".1f", scale: float = 1.0) -> str:
    """``"m ± s"`` of ``values × scale`` (``"m (n=1)"`` for one value, ``"–"`` for none).

    >>> fmt_mean_sd([0.2, 0.3, None], ".1f", 100), fmt_mean_sd([1.0]), fmt_mean_sd([])
    ('25.0 ± 7.1', '1.0 (n=1)', '–')
    """
    m, s, n = mean_sd([v * scale for v in _finite(values)])
    if n == 0:
        return "–"
    if n == 1:
        return f"{m:{fmt}} (n=1)"
    return f"{m:{fmt}} ± {s:{fmt}}"


def fmt_p(p: float, *, digits: int = 3) -> str:
    """A p-value as ``"p = 0.012"``, or ``"p < 0.001"`` where ``digits`` decimals would round it to zero (a
    p-value is never 0).

    >>> fmt_p(0.0123), fmt_p(0.00004), fmt_p(0.0005), fmt_p(float("nan"))
    ('p = 0.012', 'p < 0.001', 'p = 0.001', 'p = nan')
    """
    floor = 10.0 ** -digits
    return f"p < {floor:.{digits}f}" if p < floor / 2 else f"p = {p:.{digits}f}"


def pooled_sd(*groups: Sequence[float]) -> float:
    """Within-group pooled SD √(Σ(nᵢ−1)sᵢ² / Σ(nᵢ−1)) over groups of ≥ 1 value (nan if no group has 2).

    Raises:
        ValueError: no group given.
    """
    if not groups:
        raise ValueError("pooled_sd needs at least one group")
    ss, dof = 0.0, 0
    for g in groups:
        v = _finite(g)
        if v.size > 1:
            ss += float(((v - v.mean()) ** 2).sum())
            dof += v.size - 1
    return math.sqrt(ss / dof) if dof else float("nan")


@dataclass(frozen=True)
class WelchResult:
    """Welch's t-test of mean(a) − mean(b): statistic, two-sided p, df, the difference and its CI."""

    diff: float
    t: float
    p: float
    df: float
    ci_low: float
    ci_high: float
    n_a: int
    n_b: int

    def describe(self, scale: float = 1.0, fmt: str = ".1f") -> str:
        """``"Welch t = .., df = .., two-sided p = .., 95 % CI of the difference [.., ..], n = a vs b"``."""
        return (f"Welch t = {self.t:.2f}, df = {self.df:.1f}, two-sided {fmt_p(self.p)}, 95 % CI of the difference "
                f"[{self.ci_low * scale:{fmt}}, {self.ci_high * scale:{fmt}}], n = {self.n_a} vs {self.n_b}")


def welch(a: Sequence[float], b: Sequence[float], *, level: float = 0.95) -> WelchResult | None:
    """Welch's unequal-variance t-test of mean(a) − mean(b) (None when a group has < 2 values).

    Two equal constant groups give p = 1; two different constant groups p = 0.

    >>> r = welch([1.0, 2.0, 3.0], [4.0, 5.0, 6.5])
    >>> round(r.diff, 3), round(r.t, 3), round(r.df, 2), round(r.p, 4)
    (-3.167, -3.413, 3.81, 0.0291)
    """
    (ma, sa, na), (mb, sb, nb) = mean_sd(a), mean_sd(b)
    if na < 2 or nb < 2:
        return None
    return welch_from_summary(ma, sa, na, mb, sb, nb, level=level)


def welch_from_summary(mean_a: float, sd_a: float, n_a: int, mean_b: float, sd_b: float, n_b: int, *,
                       level: float = 0.95) -> WelchResult:
    """:func:`welch` from each group's mean, sample SD and size (what a published table gives).

    Raises:
        ValueError: a group of fewer than 2 or a negative SD.
    """
    from scipy import stats

    if n_a < 2 or n_b < 2 or sd_a < 0 or sd_b < 0:
        raise ValueError(f"need n >= 2 and SD >= 0 in each group, got n = {n_a}, {n_b}, SD = {sd_a}, {sd_b}")
    diff = float(mean_a - mean_b)
    va, vb = sd_a ** 2 / n_a, sd_b ** 2 / n_b
    se2 = va + vb
    if se2 == 0:
        p = 1.0 if diff == 0 else 0.0
        return WelchResult(diff, 0.0 if diff == 0 else math.copysign(math.inf, diff), p, float(n_a + n_b - 2),
                           diff, diff, int(n_a), int(n_b))
    df = se2 ** 2 / (va ** 2 / (n_a - 1) + vb ** 2 / (n_b - 1))
    t = diff / math.sqrt(se2)
    p = float(2 * stats.t.sf(abs(t), df))
    half = float(stats.t.ppf(0.5 + level / 2, df)) * math.sqrt(se2)
    return WelchResult(diff, float(t), p, float(df), diff - half, diff + half, int(n_a), int(n_b))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values, in the input order (family-wise error rate; nan stays nan).

    The i-th smallest p (1-based) becomes max over j ≤ i of min(1, (m − j + 1)·p₍ⱼ₎), m = number of finite p.
    """
    p = np.asarray(pvalues, dtype=np.float64)
    ok = np.flatnonzero(np.isfinite(p))
    out = np.full(p.shape, np.nan)
    m = ok.size
    running = 0.0
    for rank, i in enumerate(ok[np.argsort(p[ok], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return [float(v) for v in out]


def bonferroni(pvalues: Sequence[float]) -> list[float]:
    """min(1, m·p) for each of the m finite p-values (nan stays nan).

    >>> bonferroni([0.021, 0.5, float("nan")])
    [0.042, 1.0, nan]
    """
    p = np.asarray(pvalues, dtype=np.float64)
    m = int(np.isfinite(p).sum())
    return [min(1.0, m * float(v)) if math.isfinite(v) else float("nan") for v in p]


def verdict(*, diff: float, p: float, alpha: float = ALPHA) -> str:
    """``"reproduced"`` when p < alpha and the difference has the paper's sign (diff > 0 means the paper's
    direction), ``"not reproduced"`` when p < alpha in the other direction, else ``"inconclusive"``."""
    if not (math.isfinite(diff) and math.isfinite(p)) or p >= alpha or diff == 0:
        return "inconclusive"
    return "reproduced" if diff > 0 else "not reproduced"


@dataclass(frozen=True)
class Comparison:
    """The two-sided rule applied to mean(a) − mean(b), the paper's direction being a > b: the Welch test, its
    p-value corrected over ``family`` comparisons (Bonferroni), and the verdict."""

    welch: WelchResult
    family: int
    p_corrected: float
    verdict: str


def compare(a: Sequence[float], b: Sequence[float], *, family: int = 1, alpha: float = ALPHA) -> Comparison | None:
    """Two-sided Welch test of mean(a) − mean(b) with the paper claiming a > b: "reproduced" when the corrected p
    is below ``alpha`` and a > b, "not reproduced" when it is below ``alpha`` and a < b (the data show the
    opposite), "inconclusive" otherwise. None when a group has fewer than 2 values.

    Raises:
        ValueError: ``family`` below 1.

    >>> compare([5.0, 5.2, 4.9], [3.0, 3.1, 2.8]).verdict, compare([3.0, 3.1, 2.8], [5.0, 5.2, 4.9]).verdict
    ('reproduced', 'not reproduced')
    """
    if family < 1:
        raise ValueError(f"family must be >= 1 (the comparisons made on the same data), got {family}")
    r = welch(a, b)
    if r is None:
        return None
    p = min(1.0, r.p * family)
    return Comparison(r, int(family), p, verdict(diff=r.diff, p=p, alpha=alpha))


@dataclass(frozen=True)
class EquivalenceResult:
    """Two one-sided Welch tests of |mean(a) − mean(b)| < margin.

    Attributes:
        diff: mean(a) − mean(b).
        margin: the equivalence margin δ (> 0), in the values' units.
        p_equivalent: the TOST p-value, max of the two one-sided p's (H0: diff ≤ −δ, H0: diff ≥ δ); below α,
            equivalence is shown.
        p_beyond: the one-sided p of H0: |diff| ≤ δ against "diff beyond δ" on the side the estimate lies (below
            α, the difference is shown to exceed the margin).
        ci_low, ci_high: the 1 − 2α Welch interval of the difference (inside (−δ, δ) ⇔ p_equivalent < α).
        df: Welch–Satterthwaite degrees of freedom.
    """

    diff: float
    margin: float
    p_equivalent: float
    p_beyond: float
    ci_low: float
    ci_high: float
    df: float
    alpha: float
    n_a: int
    n_b: int

    def describe(self, scale: float = 1.0, fmt: str = ".3f") -> str:
        """``"TOST, margin ±δ: diff .., 90 % CI [.., ..], p(equivalent) = .., p(beyond margin) = .., n = a vs b"``."""
        level = round(100 * (1 - 2 * self.alpha))
        return (f"TOST, margin ±{self.margin * scale:{fmt}}: diff {self.diff * scale:+{fmt}}, {level} % CI "
                f"[{self.ci_low * scale:{fmt}}, {self.ci_high * scale:{fmt}}], p(equivalent) "
                f"{fmt_p(self.p_equivalent)[2:]}, p(beyond the margin) {fmt_p(self.p_beyond)[2:]}, "
                f"n = {self.n_a}/{self.n_b}")


def tost(a: Sequence[float], b: Sequence[float], *, margin: float, alpha: float = ALPHA) -> EquivalenceResult | None:
    """Schuirmann's two one-sided tests, Welch form, of mean(a) − mean(b) inside (−margin, margin); None when a
    group has fewer than 2 values.

    Raises:
        ValueError: ``margin`` not a positive finite number, or ``alpha`` outside (0, 0.5).
    """
    (ma, sa, na), (mb, sb, nb) = mean_sd(a), mean_sd(b)
    if na < 2 or nb < 2:
        return None
    return tost_from_summary(ma, sa, na, mb, sb, nb, margin=margin, alpha=alpha)


def tost_from_summary(mean_a: float, sd_a: float, n_a: int, mean_b: float, sd_b: float, n_b: int, *, margin: float,
                      alpha: float = ALPHA) -> EquivalenceResult:
    """:func:`tost` from each group's mean, sample SD and size.

    Raises:
        ValueError: a bad margin or alpha, a group of fewer than 2, or a negative SD.
    """
    from scipy import stats

    if not (math.isfinite(margin) and margin > 0):
        raise ValueError(f"margin must be a positive number (the largest difference still called equivalent), "
                         f"got {margin}")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha}")
    w = welch_from_summary(mean_a, sd_a, n_a, mean_b, sd_b, n_b, level=1 - 2 * alpha)
    d = w.diff
    if sd_a == 0 and sd_b == 0:  # no spread: the difference is known exactly
        inside = abs(d) < margin
        return EquivalenceResult(d, float(margin), 0.0 if inside else 1.0, 0.0 if abs(d) > margin else 1.0,
                                 d, d, w.df, float(alpha), w.n_a, w.n_b)
    se = math.sqrt(sd_a ** 2 / n_a + sd_b ** 2 / n_b)
    p_low = float(stats.t.sf((d + margin) / se, w.df))   # H0: diff <= -margin
    p_high = float(stats.t.cdf((d - margin) / se, w.df))  # H0: diff >= +margin
    p_beyond = float(min(stats.t.sf((d - margin) / se, w.df), stats.t.cdf((d + margin) / se, w.df)))
    return EquivalenceResult(d, float(margin), max(p_low, p_high), p_beyond, w.ci_low, w.ci_high, w.df,
                             float(alpha), w.n_a, w.n_b)


def equivalence_verdict(r: EquivalenceResult | None, *, family: int = 1) -> str:
    """The equivalence rule: "reproduced" when equivalence is shown (p_equivalent < α), "not reproduced" when the
    difference is shown to exceed the margin (p_beyond × ``family`` < α, Bonferroni over the pairs of which any
    one would refute the claim), "inconclusive" otherwise (including None: too few values).

    >>> far = tost([0.0, 0.1, -0.1, 0.05], [1.0, 1.1, 0.9, 1.05], margin=0.2)
    >>> equivalence_verdict(far)
    'not reproduced'
    """
    if r is None:
        return "inconclusive"
    if r.p_equivalent < r.alpha:
        return "reproduced"
    return "not reproduced" if r.p_beyond * family < r.alpha else "inconclusive"


def all_equivalent(results: Sequence[EquivalenceResult | None]) -> str:
    """A claim of sameness over several pairs (e.g. every ε against non-DP): "reproduced" only when every pair is
    shown equivalent (an intersection-union test: each at α, no correction needed), "not reproduced" when some
    pair is shown to differ by more than the margin (Bonferroni over the pairs), "inconclusive" otherwise."""
    vs = [equivalence_verdict(r, family=len(results)) for r in results]
    if vs and all(v == "reproduced" for v in vs):
        return "reproduced"
    return "not reproduced" if "not reproduced" in vs else "inconclusive"


def mean_ci(values: Sequence[float], *, level: float = 0.95) -> tuple[float, float]:
    """Student-t confidence interval of the mean ((nan, nan) for fewer than 2 values).

    >>> lo, hi = mean_ci([1.0, 2.0, 3.0]); round(lo, 3), round(hi, 3)
    (-0.484, 4.484)
    """
    from scipy import stats

    m, s, n = mean_sd(values)
    if n < 2:
        return float("nan"), float("nan")
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * s / math.sqrt(n)
    return m - half, m + half


@dataclass(frozen=True)
class ChanceResult:
    """Accuracy against chance: the one-sided binomial p of "better than chance" and the near-chance flag."""

    accuracy: float
    chance: float
    n: int
    p_above: float
    near: bool


def chance_test(accuracy: float, *, n: int, chance: float, margin: float = 0.05) -> ChanceResult:
    """Is ``accuracy`` on ``n`` test examples better than ``chance``, and is it within ``margin`` of it?

    ``near`` is True when accuracy − chance < margin (an arm that learned next to nothing: its comparisons say
    little about the method), whatever the p-value.

    >>> r = chance_test(0.123, n=1000, chance=0.1)
    >>> r.near, round(r.p_above, 4)
    (True, 0.0104)
    """
    from scipy import stats

    if not (0 < chance < 1) or n < 1 or not 0 <= accuracy <= 1:
        raise ValueError(f"need 0 < chance < 1, n >= 1 and 0 <= accuracy <= 1, got {chance}, {n}, {accuracy}")
    k = int(round(accuracy * n))
    p = float(stats.binomtest(k, n, chance, alternative="greater").pvalue)
    return ChanceResult(float(accuracy), float(chance), int(n), p, accuracy - chance < margin)


@dataclass(frozen=True)
class LinearFit:
    """Least squares y = intercept + slope·x: R², residual degrees of freedom (n − 2), slope SE and p (t-test of
    slope = 0; nan when df = 0)."""

    slope: float
    intercept: float
    r_squared: float
    dof: int
    slope_se: float
    p_slope: float


def linear_fit(x: Sequence[float], y: Sequence[float]) -> LinearFit:
    """Ordinary least squares of ``y`` on ``x`` with what a reader needs to judge it.

    Three points leave one degree of freedom: R² near 1 is then weak evidence, which is why :class:`LinearFit`
    carries ``dof`` and the slope's p-value.

    Raises:
        ValueError: fewer than 2 points, different lengths, or constant x.

    >>> f = linear_fit([0, 1, 2, 3], [1.0, 3.0, 5.0, 7.0])
    >>> round(f.slope, 9), round(f.intercept, 9), f.r_squared, f.dof
    (2.0, 1.0, 1.0, 2)
    """
    from scipy import stats

    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if xs.shape != ys.shape or xs.ndim != 1 or xs.size < 2:
        raise ValueError(f"x and y must be 1-D of equal length >= 2, got {xs.shape} and {ys.shape}")
    if np.ptp(xs) == 0:
        raise ValueError("x is constant: the slope is undefined")
    slope, intercept = np.polyfit(xs, ys, 1)
    resid = ys - (intercept + slope * xs)
    ss_res, ss_tot = float((resid ** 2).sum()), float(((ys - ys.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res <= 1e-24 else float("nan"))
    dof = xs.size - 2
    if dof > 0:
        se = math.sqrt(ss_res / dof / float(((xs - xs.mean()) ** 2).sum()))
        p = float(2 * stats.t.sf(abs(slope / se), dof)) if se > 0 else 0.0
    else:
        se, p = float("nan"), float("nan")
    return LinearFit(float(slope), float(intercept), float(r2), int(dof), se, p)
