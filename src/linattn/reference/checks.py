"""Input validation for the reference: every public function checks its arguments before any work.

Each helper raises ``TypeError`` (wrong kind of object) or ``ValueError`` (wrong shape or range)
with a message that names the argument and says what was expected. Public, so that the
experiments built on the reference check their sizes the same way (``as_positive_int``).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable

import numpy as np


def as_matrix(name: str, X: object) -> np.ndarray:
    """``X`` as a finite 2-D float64 array, or an error naming ``name``."""
    array = _as_float_array(name, X)
    if array.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (rows are tokens), got shape {array.shape}")
    return _finite(name, array)


def as_vector(name: str, x: object, length: int | None = None) -> np.ndarray:
    """``x`` as a finite 1-D float64 array (of ``length`` entries if given), or an error."""
    array = _as_float_array(name, x)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {array.shape}")
    if length is not None and len(array) != length:
        raise ValueError(f"{name} must have {length} entries, got {len(array)}")
    return _finite(name, array)


def as_beta(beta: object, length: int) -> np.ndarray:
    """The write strengths: a finite 1-D array of ``length`` entries in [0, 2] (section 7.2)."""
    array = as_vector("beta", beta, length)
    if np.any(array < 0.0) or np.any(array > 2.0):
        raise ValueError(
            f"beta must lie in [0, 2] (section 7.2), got values from {array.min()} to {array.max()}"
        )
    return array


def as_scalar_beta(beta: object) -> float:
    """One write strength in [0, 2]."""
    if isinstance(beta, bool) or not isinstance(beta, numbers.Real):
        raise TypeError(f"beta must be a real number, got {type(beta).__name__}")
    value = float(beta)
    if not 0.0 <= value <= 2.0:
        raise ValueError(f"beta must lie in [0, 2] (section 7.2), got {value}")
    return value


def as_positive_int(name: str, value: object) -> int:
    """A positive integer (a size, a count, a chunk size), or an error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer >= 1, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value}")
    return int(value)


def as_chunk_size(C: object) -> int:
    """The chunk size C: an integer >= 1 (it need not divide n; section 5.1)."""
    return as_positive_int("C", C)


def as_flag(name: str, value: object) -> bool:
    """A yes/no option such as ``causal``: a bool, not merely something truthy."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def as_real(name: str, value: object) -> float:
    """A finite real number, or an error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


def as_feature_map(phi: object) -> Callable[[np.ndarray], np.ndarray]:
    """The feature map phi: a callable from an (n, d) array to an (n, r) array."""
    if not callable(phi):
        raise TypeError(f"phi must be a callable feature map, got {type(phi).__name__}")
    return phi


def same_shape(names: tuple[str, str], A: np.ndarray, B: np.ndarray) -> None:
    """Raise unless ``A`` and ``B`` have the same shape."""
    if A.shape != B.shape:
        raise ValueError(
            f"{names[0]} and {names[1]} must have the same shape, got {A.shape} and {B.shape}"
        )


def same_rows(names: tuple[str, str], A: np.ndarray, B: np.ndarray) -> None:
    """Raise unless ``A`` and ``B`` have the same number of rows (tokens)."""
    if A.shape[0] != B.shape[0]:
        raise ValueError(
            f"{names[0]} and {names[1]} must have the same number of rows (tokens), "
            f"got {A.shape[0]} and {B.shape[0]}"
        )


def same_columns(names: tuple[str, str], A: np.ndarray, B: np.ndarray) -> None:
    """Raise unless ``A`` and ``B`` have the same number of columns."""
    if A.shape[1] != B.shape[1]:
        raise ValueError(
            f"{names[0]} and {names[1]} must have the same number of columns, "
            f"got {A.shape[1]} and {B.shape[1]}"
        )


def non_empty(name: str, A: np.ndarray) -> None:
    """Raise if ``A`` has no entries (an empty sequence has no rows to normalise)."""
    if A.size == 0:
        raise ValueError(f"{name} must not be empty, got shape {A.shape}")


def features(name: str, phi: Callable[[np.ndarray], np.ndarray], X: np.ndarray) -> np.ndarray:
    """``phi(X)``, checked: finite, nonnegative, one row per row of ``X`` (section 4)."""
    F = np.asarray(phi(X), dtype=np.float64)
    if F.ndim != 2 or F.shape[0] != X.shape[0]:
        raise ValueError(
            f"phi({name}) must be a 2-D array with {X.shape[0]} rows, got shape {F.shape}"
        )
    if not np.all(np.isfinite(F)):
        raise ValueError(f"phi({name}) has non-finite entries (the feature map overflowed)")
    if np.any(F < 0):
        raise ValueError(f"phi({name}) must be nonnegative (section 4), got a negative feature")
    return F


def positive_denominator(name: str, denominator: np.ndarray) -> None:
    """Raise if a normaliser z^T phi(q) is not positive (section 4): the output would be NaN."""
    if np.any(denominator <= 0):
        raise ValueError(
            f"{name} is not positive for some query; use a strictly positive feature map phi"
        )


def _as_float_array(name: str, X: object) -> np.ndarray:
    array = np.asarray(X)
    if array.dtype == bool or not (
        np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)
    ):
        raise TypeError(f"{name} must be an array of real numbers, got dtype {array.dtype}")
    return array.astype(np.float64)


def _finite(name: str, array: np.ndarray) -> np.ndarray:
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite, got NaN or infinite entries")
    return array
