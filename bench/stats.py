"""Mean and 95% confidence interval (Student t), ratios."""
from __future__ import annotations

import math

# two-sided 95%: t quantile 0.975 for 1..30 degrees of freedom
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042]


def t975(df: int) -> float:
    if df < 1:
        return float("nan")
    if df <= 30:
        return _T975[df - 1]
    z = 1.959964  # Cornish-Fisher expansion of the t quantile around the normal one
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_ci(values: list[float]) -> tuple[float, float, int]:
    """(mean, half-width of the 95% CI, n). The half-width is nan for n < 2."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    n = len(vals)
    if n == 0:
        return float("nan"), float("nan"), 0
    m = sum(vals) / n
    if n < 2:
        return m, float("nan"), n
    var = sum((v - m) ** 2 for v in vals) / (n - 1)
    return m, t975(n - 1) * math.sqrt(var / n), n


def ratio(a: float, b: float) -> float:
    if b is None or a is None or b == 0 or math.isnan(a) or math.isnan(b):
        return float("nan")
    return a / b


def fmt_num(v: float, digits: int = 3) -> str:
    """Compact human formatting with ~`digits` significant digits."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1 and float(v).is_integer():
        return f"{int(v):,}"
    if a >= 10 ** digits:
        return f"{v:,.0f}"
    decimals = max(0, digits - 1 - int(math.floor(math.log10(a))))
    return f"{v:,.{decimals}f}"


def fmt_mean_ci(values: list[float], digits: int = 3) -> str:
    m, h, n = mean_ci(values)
    if n == 0:
        return "–"
    if n < 2:
        return fmt_num(m, digits)
    if h <= abs(m) * 1e-4:
        return f"{fmt_num(m, digits)} ± 0"
    return f"{fmt_num(m, digits)} ± {fmt_num(h, 2)}"
