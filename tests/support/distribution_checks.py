"""Checks that sampled tokens follow a distribution: two-sample and goodness-of-fit chi-square,
and a probability-integral-transform test of draws against their own distributions."""

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


def chi2_goodness_of_fit(counts, probs) -> tuple[float, int]:
    """Chi-square statistic and degrees of freedom of observed category counts against the
    probabilities they should follow; categories expected fewer than 5 times are pooled."""
    n = sum(counts)
    cats, pooled_o, pooled_e = [], 0.0, 0.0
    for o, p in zip(counts, probs):
        e = n * p
        if e >= 5:
            cats.append((o, e))
        else:
            pooled_o, pooled_e = pooled_o + o, pooled_e + e
    if pooled_e > 0:
        cats.append((pooled_o, pooled_e))
    return sum((o - e) ** 2 / e for o, e in cats), len(cats) - 1


def pit_ks(draws) -> tuple[float, float]:
    """Randomised probability integral transform: for draws [(probs, drawn index)] from their own
    distributions, u = P(X before x) + U * P(x) (categories in descending probability) is
    uniform on [0, 1]. Returns the Kolmogorov-Smirnov distance of the u's from uniform and its
    critical value at p = 0.001."""
    import random

    rnd = random.Random(0)
    us = []
    for probs, x in draws:
        order = sorted(range(len(probs)), key=lambda i: -probs[i])
        before = sum(probs[i] for i in order[: order.index(x)])
        us.append(before + rnd.random() * probs[x])
    us.sort()
    n = len(us)
    distance = max(max((i + 1) / n - u, u - i / n) for i, u in enumerate(us))
    return distance, 1.95 / math.sqrt(n)
