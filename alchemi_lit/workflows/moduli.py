"""Polycrystalline moduli and the Born test of an elastic tensor.

Voigt (uniform strain) and Reuss (uniform stress) bounds and their Hill average, in
the textbook form pymatgen's ``ElasticTensor`` uses (``k_voigt``, ``g_reuss`` ...; the
tests hold them to it).  Born stability in Mouhat & Coudert's general form (PRB 90,
224104, 2014): a crystal of any symmetry is mechanically stable when ``C`` is positive
definite, which is what the symmetry-specific inequalities spell out case by case.
"""

from __future__ import annotations

import numpy as np


def moduli(c: np.ndarray) -> dict[str, float]:
    """Moduli of ``c`` (6 x 6, Voigt order, any unit: the moduli come in the same).

    Returns ``K_V``, ``K_R``, ``K_VRH``, ``G_V``, ``G_R``, ``G_VRH``, ``E_VRH`` (Young's
    modulus ``9KG / (3K + G)``), ``poisson`` (``(3K - 2G) / (6K + 2G)``), the smallest
    eigenvalue of the symmetrised ``c`` (``born_min_eigenvalue``) and ``born_stable``
    (it is > 0).  The Reuss values are NaN where ``c`` is singular.
    """
    c = 0.5 * (np.asarray(c, dtype=np.float64) + np.asarray(c, dtype=np.float64).T)
    k_v = (c[0, 0] + c[1, 1] + c[2, 2] + 2.0 * (c[0, 1] + c[1, 2] + c[0, 2])) / 9.0
    g_v = (
        (c[0, 0] + c[1, 1] + c[2, 2]) - (c[0, 1] + c[1, 2] + c[0, 2])
        + 3.0 * (c[3, 3] + c[4, 4] + c[5, 5])
    ) / 15.0  # fmt: skip
    try:
        s = np.linalg.inv(c)
        k_r = 1.0 / (s[0, 0] + s[1, 1] + s[2, 2] + 2.0 * (s[0, 1] + s[1, 2] + s[0, 2]))
        g_r = 15.0 / (
            4.0 * (s[0, 0] + s[1, 1] + s[2, 2]) - 4.0 * (s[0, 1] + s[1, 2] + s[0, 2])
            + 3.0 * (s[3, 3] + s[4, 4] + s[5, 5])
        )  # fmt: skip
    except np.linalg.LinAlgError:
        k_r = g_r = np.nan
    k, g = 0.5 * (k_v + k_r), 0.5 * (g_v + g_r)
    lowest = float(np.linalg.eigvalsh(c)[0])
    return {
        "K_V": float(k_v), "K_R": float(k_r), "K_VRH": float(k),
        "G_V": float(g_v), "G_R": float(g_r), "G_VRH": float(g),
        "E_VRH": float(9.0 * k * g / (3.0 * k + g)),
        "poisson": float((3.0 * k - 2.0 * g) / (6.0 * k + 2.0 * g)),
        "born_min_eigenvalue": lowest,
        "born_stable": bool(lowest > 0.0),
    }  # fmt: skip
