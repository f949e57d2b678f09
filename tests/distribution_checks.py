"""Two-sample chi-square checks that sampled tokens follow the target's distribution."""

import math
from collections import Counter


def chi2_homogeneity(a: Counter, b: Counter) -> tuple[float, int]:
    """Two-sample chi-square statistic and degrees of freedom; rare categories are pooled."""
    na, nb = sum(a.values()), sum(b.values())
    cats, rare_a, rare_b = [], 0, 0
    for k in set(a) | set(b):
        if a[k] + b[k] >= 10:
            cats.append((a[k], b[k]))
        else:
            rare_a, rare_b = rare_a + a[k], rare_b + b[k]
    if rare_a + rare_b:
        cats.append((rare_a, rare_b))
    stat = 0.0
    for ca, cb in cats:
        tot = ca + cb
        ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
        stat += (ca - ea) ** 2 / ea + (cb - eb) ** 2 / eb
    return stat, len(cats) - 1


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Upper quantile (p = 0.001 for z = 3.09) by the Wilson-Hilferty approximation."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
