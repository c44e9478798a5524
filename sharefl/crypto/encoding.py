"""Fixed-point encoding of float vectors into the ring Z_2^b for secure aggregation.

Each client encodes its update ``x`` as integers mod ``2**b`` (``b`` = 32 or 64), masks it,
and the server adds ``k`` masked vectors mod ``2**b``; the masks cancel and :func:`decode`
turns the ring sum back into floats. Encoding one vector:

1. **L2 clipping** (only if ``l2_clip`` is set): if ``||x||_2 > l2_clip``, ``x`` is multiplied
   by ``l2_clip / ||x||_2`` (norm and product in float64).
2. **Per-coordinate clipping** to ``[-c, c]`` with ``c = encoding.coordinate_bound =
   min(clip, l2_clip)``. After step 1 no coordinate exceeds ``l2_clip`` anyway (up to float64
   rounding); clipping to ``c`` makes ``|value| <= c`` hold exactly. :func:`clip_values`
   returns the result of steps 1-2.
3. **Unbiased stochastic rounding** of ``y = value * 2**f`` (ring units of ``2**-f``):
   ``r = floor(y + u)``, ``u`` uniform in ``[0, 1)``, so ``E[r] = y``. ``u`` has 32 random
   bits and ``y + u`` is never rounded to float64 precision (which would lose bits of ``u``
   once ``|y| > 2**21``): ``r = floor(y) + [U < frac(y) * 2**32]`` with ``U`` a uniform
   32-bit integer, so ``|r - y| <= 1`` and ``|E[r] - y| <= 2**-32 + 2**-52`` units. Float32
   inputs without L2 rescaling (b = 32) take a faster path in float32/int32 arithmetic,
   exact because their ``y`` has at most 24 significant bits.
4. ``r`` is stored in two's complement mod ``2**b`` (``np.uint32`` or ``np.uint64``).

**No wrap-around.** ``|r| <= c * 2**f + 1``, so a sum of ``k`` encodings stays within
``k * (c * 2**f + 1)`` in magnitude. :class:`RingEncoding` refuses parameters unless
``max_summands * (c * 2**f + 1) <= 2**(b-1) - 1``; then the signed sum of up to
``max_summands`` encodings is recovered exactly from the ring sum. Nothing wraps silently.

**Randomness.** Coordinate ``j`` uses the ``j``-th 32-bit word (native byte order) of an
AES-128-CTR keystream (``cryptography``) whose key and initial counter block are
``rng.bytes(32)[:16]`` and ``[16:]``, drawn once per call. With AES-NI this is several
times faster than numpy's bit generators; a seed reproduces the output. (Rounding noise
needs no secrecy; this is not a source for DP noise.)
"""

from __future__ import annotations

import contextlib
import math
import operator
import sys
import threading
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any, Final, TypeAlias

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from sharefl.crypto.errors import EncodingError, SumOutOfRange, UnsafeEncodingError

__all__ = [
    "MAX_FRAC_BITS",
    "RingEncoding",
    "RngLike",
    "choose_encoding",
    "clip_values",
    "decode",
    "encode",
    "encode_into",
]

RngLike: TypeAlias = np.random.Generator | int | None
"""A ``numpy.random.Generator``, an int seed, or ``None`` (fresh OS entropy)."""

#: Largest accepted ``frac_bits``: the b = 32 encoder scales by ``2**(f + 32)`` in float64.
MAX_FRAC_BITS: Final = 1023 - 32

_BLOCK: Final = 1 << 17  # elements per block: the scratch buffers stay in cache
_ZEROS: Final = bytes(4 * _BLOCK)  # AES-CTR encrypts zeros into the keystream itself
_BELOW_2_32: Final = np.float32(2.0**32 - 2.0**8)  # the largest float32 below 2**32


@dataclass(frozen=True)
class RingEncoding:
    """Parameters of the fixed-point encoding into ``Z_2^bits``.

    Attributes:
        bits: Ring width ``b``: 32 or 64.
        frac_bits: Fractional bits ``f``, ``0 <= f <= MAX_FRAC_BITS``: one unit is ``2**-f``.
        clip: Per-coordinate bound (finite, > 0).
        max_summands: Most encodings ``k >= 1`` that may be added up.
        l2_clip: If set (finite, > 0), vectors are first scaled down to L2 norm
            ``<= l2_clip``. Coordinates are then clipped to ``[-c, c]`` with
            ``c = coordinate_bound = min(clip, l2_clip)``.

    Raises:
        EncodingError: A field has the wrong type or range.
        UnsafeEncodingError: ``max_summands * (c * 2**f + 1) > 2**(b-1) - 1``: a sum of
            ``max_summands`` encodings could wrap around. The message names the numbers
            and the largest safe ``frac_bits``, ``c`` and ``max_summands``.
    """

    bits: int
    frac_bits: int
    clip: float
    max_summands: int
    l2_clip: float | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.bits) or self.bits not in (32, 64):
            raise EncodingError(f"bits must be 32 or 64, got {self.bits!r}")
        if not _is_int(self.frac_bits) or not 0 <= self.frac_bits <= MAX_FRAC_BITS:
            raise EncodingError(
                f"frac_bits must be an int in [0, {MAX_FRAC_BITS}], got {self.frac_bits!r}"
            )
        if not _is_int(self.max_summands) or self.max_summands < 1:
            raise EncodingError(f"max_summands must be an int >= 1, got {self.max_summands!r}")
        # Normalise numpy scalars to Python int/float (exact arithmetic, equality, hashing).
        object.__setattr__(self, "bits", int(self.bits))
        object.__setattr__(self, "frac_bits", int(self.frac_bits))
        object.__setattr__(self, "max_summands", int(self.max_summands))
        object.__setattr__(self, "clip", _positive_float("clip", self.clip))
        if self.l2_clip is not None:
            object.__setattr__(self, "l2_clip", _positive_float("l2_clip", self.l2_clip))
        if not _is_safe(self.bits, self.frac_bits, self.coordinate_bound, self.max_summands):
            raise UnsafeEncodingError(_unsafe_message(self))

    @property
    def coordinate_bound(self) -> float:
        """``c = min(clip, l2_clip)``: no clipped coordinate exceeds it in magnitude."""
        return self.clip if self.l2_clip is None else min(self.clip, self.l2_clip)

    @property
    def dtype(self) -> type[np.unsignedinteger[Any]]:
        """Ring element dtype: ``np.uint32`` for b = 32, ``np.uint64`` for b = 64."""
        return np.uint32 if self.bits == 32 else np.uint64

    @property
    def scale(self) -> float:
        """``2**frac_bits``: ring units per unit of value."""
        return 2.0**self.frac_bits

    @property
    def max_abs_encoded(self) -> int:
        """Bound on one encoded coordinate, ``|r| <= floor(c * 2**f) + 1``."""
        bound: int = math.floor(Fraction(self.coordinate_bound) * 2**self.frac_bits)
        return bound + 1

    def sum_error_bound(self, k: int) -> float:
        """Proven error bound, per coordinate, of a decoded sum of ``k`` encodings.

        For equal-length inputs ``x_1..x_k`` and ``1 <= k <= max_summands``::

            max_j |decode(sum_i encode(x_i), k)[j] - sum_i clip_values(x_i)[j]|
                <= k * 2**-f                                 (b = 32)
                <= k * 2**-f + k * (c + 2**-f) * 2**-53      (b = 64)

        with the right-hand sum in exact arithmetic: each encoded coordinate is within one
        unit ``2**-f`` of its clipped value, and the ring sum does not wrap. For b = 64 the
        float64 result of :func:`decode` is also rounded once the sum exceeds ``2**53``
        units, which the second term covers.

        Raises:
            EncodingError: ``k`` is not an int >= 1.
            UnsafeEncodingError: ``k > max_summands``.
        """
        k = _check_summands(k, self)
        bound = k * 2.0**-self.frac_bits
        if self.bits == 64:
            bound += k * (self.coordinate_bound + 2.0**-self.frac_bits) * 2.0**-53
        return bound


def choose_encoding(
    clip: float,
    max_summands: int,
    *,
    bits: int = 32,
    l2_clip: float | None = None,
    frac_bits: int | None = None,
) -> RingEncoding:
    """Return a safe :class:`RingEncoding`; by default with the most fractional bits.

    With ``frac_bits=None``, picks the largest ``f <= MAX_FRAC_BITS`` with
    ``max_summands * (c * 2**f + 1) <= 2**(bits-1) - 1`` (``c = min(clip, l2_clip)``);
    otherwise validates the given ``frac_bits``.

    Raises:
        EncodingError: A parameter has the wrong type or range.
        UnsafeEncodingError: Not even ``f = 0`` is safe, or the given ``frac_bits`` is not.
    """
    if frac_bits is not None:
        return RingEncoding(bits, frac_bits, clip, max_summands, l2_clip)
    base = RingEncoding(bits, 0, clip, max_summands, l2_clip)  # validates; raises if f=0 unsafe
    b, c, k = base.bits, base.coordinate_bound, base.max_summands
    room = (Fraction(2 ** (b - 1) - 1, k) - 1) / Fraction(c)  # f is safe iff 2**f <= room
    f = min(MAX_FRAC_BITS, room.numerator.bit_length() - room.denominator.bit_length() + 1)
    while not _is_safe(b, f, c, k):  # starts at most two steps too high; f = 0 is safe
        f -= 1
    return replace(base, frac_bits=f)


def clip_values(x: Any, encoding: RingEncoding) -> np.ndarray:
    """Return the clipped values that :func:`encode` rounds: a new 1-D float64 array.

    ``x`` (as for :func:`encode`) is flattened in C order, L2-clipped if
    ``encoding.l2_clip`` is set, then clipped to ``[-c, c]``, ``c = coordinate_bound``.
    This is the reference of :meth:`RingEncoding.sum_error_bound`.

    Raises:
        EncodingError: ``x`` is not a float array/tensor, or has NaN/inf values.
    """
    flat = _as_flat_float(x)
    c = encoding.coordinate_bound
    y = flat.astype(np.float64) * _l2_factor(flat, encoding, _peak(flat))
    return np.clip(y, -c, c, out=y)


def encode(x: Any, encoding: RingEncoding, rng: RngLike) -> np.ndarray:
    """Encode ``x`` into ``Z_2^b``: return a new 1-D array of ``encoding.dtype``.

    Args:
        x: The values: a numpy array (or array-like) or a torch tensor of any shape and
            device, float16/32/64 (other float tensors are widened to float32; tensors are
            copied to the CPU). Flattened in C order.
        encoding: The ring parameters.
        rng: Randomness for the rounding (see :data:`RngLike`). 32 bytes are drawn from it
            per call, so the same seed or generator state gives the same output.

    Returns:
        ``r`` of shape ``(x.size,)``: ``r[j] = floor(y[j] + u[j]) mod 2**b`` (two's
        complement) with ``y = clip_values(x, encoding) * 2**f`` and ``u`` uniform in
        ``[0, 1)`` with 32 random bits, so ``|r[j] - y[j]| <= 1`` and
        ``|E[r[j]] - y[j]| <= 2**-32 + 2**-52`` (units of ``2**-f``).

    Raises:
        EncodingError: ``x`` is not float, or has NaN/inf values (the message counts them);
            ``rng`` has the wrong type.
    """
    flat = _as_flat_float(x)
    out = np.empty(flat.size, dtype=encoding.dtype)
    _encode_flat(flat, encoding, rng, out)
    return out


def encode_into(x: Any, encoding: RingEncoding, rng: RngLike, out: np.ndarray) -> np.ndarray:
    """Like :func:`encode`, but write into the caller's buffer ``out`` and return it.

    ``out`` must be a writeable 1-D numpy array of ``encoding.dtype`` with ``x.size``
    elements that does not overlap ``x``. For the same ``rng`` state the result equals
    :func:`encode`'s. If encoding fails, ``out`` may have been partly overwritten.

    Raises:
        EncodingError: ``out`` is not such an array; or as :func:`encode`.
    """
    flat = _as_flat_float(x)
    if not isinstance(out, np.ndarray):
        raise EncodingError(f"out must be a numpy array, got {type(out).__name__}")
    if out.dtype != encoding.dtype:
        raise EncodingError(
            f"out has dtype {out.dtype}, expected {np.dtype(encoding.dtype)} for b={encoding.bits}"
        )
    if out.shape != (flat.size,):
        raise EncodingError(f"out has shape {out.shape}, expected ({flat.size},)")
    if not out.flags.writeable:
        raise EncodingError("out is read-only")
    if np.may_share_memory(flat, out):
        raise EncodingError("out overlaps the input")
    _encode_flat(flat, encoding, rng, out)
    return out


def decode(total: np.ndarray, encoding: RingEncoding, num_summands: int) -> np.ndarray:
    """Decode the ring sum of ``num_summands`` encodings into float64 values.

    Args:
        total: Sum mod ``2**b`` of the encodings (masks removed), an array of
            ``encoding.dtype`` of any shape.
        encoding: The parameters every summand was encoded with.
        num_summands: How many encodings were added, ``1 <= num_summands <= max_summands``.

    Returns:
        A new float64 array shaped like ``total``: its two's complement value times
        ``2**-f``. Accuracy: :meth:`RingEncoding.sum_error_bound`.

    Raises:
        UnsafeEncodingError: ``num_summands > encoding.max_summands``.
        EncodingError: ``total`` is not an array of ``encoding.dtype``; ``num_summands`` is
            not an int >= 1.
        SumOutOfRange: a coordinate exceeds ``num_summands * max_abs_encoded`` in
            magnitude, which no honest sum can (a summand was out of range, masks did not
            cancel, or the summands were encoded with other parameters).
    """
    if not isinstance(total, np.ndarray) or total.dtype != encoding.dtype:
        got = total.dtype if isinstance(total, np.ndarray) else type(total).__name__
        raise EncodingError(
            f"total must be a numpy array of {np.dtype(encoding.dtype)} for b={encoding.bits},"
            f" got {got}"
        )
    k = _check_summands(num_summands, encoding)
    signed = total.view(np.int32 if encoding.bits == 32 else np.int64)
    if signed.size:
        limit = k * encoding.max_abs_encoded
        lo, hi = int(signed.min()), int(signed.max())
        if max(-lo, hi) > limit:
            raise SumOutOfRange(
                f"decoded value {lo if -lo > hi else hi} exceeds the largest possible sum of"
                f" {k} encodings ({limit} units): the masks did not cancel, more than {k}"
                " vectors were added, or they used different encodings"
            )
    values = signed.astype(np.float64)
    values *= 2.0**-encoding.frac_bits
    return values


# --------------------------------------------------------------------------------- internals


def _is_int(v: object) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool | np.bool_)


def _positive_float(name: str, v: object) -> float:
    """``v`` as a float if it is a finite real number > 0; else raise EncodingError."""
    value = math.nan
    if isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool):
        with contextlib.suppress(OverflowError):  # ints beyond the float range stay NaN
            value = float(v)
    if not (math.isfinite(value) and value > 0):
        raise EncodingError(f"{name} must be a finite number > 0, got {v!r}")
    return value


def _is_safe(bits: int, frac_bits: int, c: float, k: int) -> bool:
    """``k * (c * 2**f + 1) <= 2**(bits-1) - 1``, in exact rational arithmetic."""
    return bool(k * (Fraction(c) * 2**frac_bits + 1) <= 2 ** (bits - 1) - 1)


def _unsafe_message(e: RingEncoding) -> str:
    c, k, f, b = e.coordinate_bound, e.max_summands, e.frac_bits, e.bits
    limit = 2 ** (b - 1) - 1
    fixes = []
    f_ok = next((g for g in range(f - 1, -1, -1) if _is_safe(b, g, c, k)), None)
    if f_ok is not None:
        fixes.append(f"frac_bits <= {f_ok}")
    if Fraction(limit, k) > 1:
        c_ok = _round_down((Fraction(limit, k) - 1) / 2**f)
        fixes.append(f"coordinate bound min(clip, l2_clip) <= {c_ok}")
    k_ok = int(limit // (Fraction(c) * 2**f + 1))
    if k_ok >= 1:
        fixes.append(f"max_summands <= {k_ok}")
    if b == 32:
        fixes.append("bits=64")
    return (
        f"the sum of max_summands={k} encodings could wrap around in Z_2^{b}: "
        f"{k} * (c * 2**{f} + 1) = {float(k * (Fraction(c) * 2**f + 1)):.6g} with c={c!r} "
        f"exceeds 2**{b - 1} - 1 = {limit}. Any one of these fixes it: " + "; ".join(fixes) + "."
    )


def _round_down(q: Fraction, digits: int = 6) -> str:
    """``q > 0`` rounded down to ``digits`` significant digits, as text."""
    step = Fraction(10) ** (math.floor(math.log10(q)) - digits + 1)
    return f"{float(math.floor(q / step) * step):.{digits}g}"


def _check_summands(k: object, encoding: RingEncoding) -> int:
    if not _is_int(k) or operator.index(k) < 1:  # type: ignore[arg-type]
        raise EncodingError(f"the number of summands must be an int >= 1, got {k!r}")
    k = operator.index(k)  # type: ignore[arg-type]
    if k > encoding.max_summands:
        raise UnsafeEncodingError(
            f"{k} summands exceed max_summands={encoding.max_summands} of this encoding, so"
            " their sum may have wrapped around: add fewer vectors or use an encoding made"
            " for more summands"
        )
    return k


def _as_flat_float(x: Any) -> np.ndarray:
    """``x`` as a 1-D, C-contiguous, native-order float16/32/64 array (a view if possible)."""
    torch = sys.modules.get("torch")  # a tensor means torch is loaded: never imported here
    if torch is not None and isinstance(x, torch.Tensor):
        t = x.detach()
        if not t.is_floating_point():
            raise EncodingError(f"expected a floating-point tensor, got {t.dtype}")
        if t.dtype not in (torch.float16, torch.float32, torch.float64):
            t = t.to(torch.float32)  # bfloat16 and the like widen exactly
        x = t.cpu().resolve_conj().resolve_neg().numpy()
    arr = np.asarray(x)
    if arr.dtype.kind != "f" or arr.dtype.itemsize > 8:
        raise EncodingError(f"expected float16/32/64 values, got dtype {arr.dtype}")
    return np.ravel(arr.astype(arr.dtype.newbyteorder("="), copy=False), order="C")


def _peak(flat: np.ndarray) -> float:
    """``max(|x|)`` (0 if empty); raises EncodingError if ``x`` has NaN or inf values."""
    if flat.size == 0:
        return 0.0
    # min/max propagate NaN and show inf, with no temporary array. (A BLAS dot would be
    # cheaper, but OpenBLAS threads keep spinning afterwards and slow what follows.)
    peak = max(-float(flat.min()), float(flat.max()))
    if math.isfinite(peak):
        return peak
    bad = flat.size - int(np.count_nonzero(np.isfinite(flat)))
    raise EncodingError(f"input has {bad} non-finite value(s) (NaN or inf) of {flat.size}")


def _l2_factor(flat: np.ndarray, encoding: RingEncoding, peak: float) -> float:
    """``min(1, l2_clip / ||x||_2)`` with the norm in float64; 1 without ``l2_clip``."""
    if encoding.l2_clip is None or peak == 0:
        return 1.0
    norm = math.sqrt(_sum_of_squares(flat, 0))
    if 0 < norm < math.inf:
        return min(1.0, encoding.l2_clip / norm)
    # The squares under- or overflowed: ||x|| = ||x * 2**-e|| * 2**e, scaling exactly.
    e = math.frexp(peak)[1]
    ratio = encoding.l2_clip / math.sqrt(_sum_of_squares(flat, -e))
    return 1.0 if math.frexp(ratio)[1] - e > 1 else min(1.0, math.ldexp(ratio, -e))


def _sum_of_squares(flat: np.ndarray, shift: int) -> float:
    """``sum((x * 2**shift)**2)`` in float64, blockwise (pairwise sums within blocks)."""
    y = _scratch().y
    total = 0.0
    with np.errstate(over="ignore", under="ignore"):
        for i in range(0, flat.size, _BLOCK):
            block = y[: min(_BLOCK, flat.size - i)]
            np.copyto(block, flat[i : i + _BLOCK])
            if shift:
                np.ldexp(block, shift, out=block)
            np.multiply(block, block, out=block)
            total += float(np.add.reduce(block))
    return total


def _generator(rng: RngLike) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or _is_int(rng):
        return np.random.default_rng(rng)
    raise EncodingError(
        f"rng must be a numpy.random.Generator, an int seed or None, got {type(rng).__name__}"
    )


class _Scratch:
    """Scratch buffers for one block, kept per thread and reused across calls."""

    def __init__(self) -> None:
        self.y = np.empty(_BLOCK)
        self.a = np.empty(_BLOCK)
        self.u = np.empty(_BLOCK)
        self.f32 = np.empty(_BLOCK, dtype=np.float32)
        self.f32b = np.empty(_BLOCK, dtype=np.float32)
        self.u32 = np.empty(_BLOCK, dtype=np.uint32)
        self.i64 = np.empty(_BLOCK, dtype=np.int64)
        self.carry = np.empty(_BLOCK, dtype=bool)
        self.keystream = np.empty(_BLOCK, dtype=np.uint32)
        self.keystream_bytes = memoryview(self.keystream.data).cast("B")


_local = threading.local()


def _scratch() -> _Scratch:
    scratch = getattr(_local, "scratch", None)
    if scratch is None:
        scratch = _local.scratch = _Scratch()
    return scratch


def _encode_flat(flat: np.ndarray, encoding: RingEncoding, rng: RngLike, out: np.ndarray) -> None:
    key_and_nonce = _generator(rng).bytes(32)
    if flat.size == 0:
        return
    peak = _peak(flat)
    factor = _l2_factor(flat, encoding, peak)
    clip = peak * factor > encoding.coordinate_bound  # else clipping is a no-op: skip it
    cipher = Cipher(algorithms.AES(key_and_nonce[:16]), modes.CTR(key_and_nonce[16:]))
    keystream = cipher.encryptor()
    scratch = _scratch()
    short = encoding.bits == 32 and _short_significands(flat, encoding, factor, clip)
    with np.errstate(over="ignore"):  # huge finite values may scale to inf, then clip
        for i in range(0, flat.size, _BLOCK):
            n = min(_BLOCK, flat.size - i)
            keystream.update_into(memoryview(_ZEROS)[: 4 * n], scratch.keystream_bytes)
            if short:
                _encode_block_float32(flat[i : i + n], encoding, clip, scratch, out[i : i + n])
            else:
                _encode_block_float64(
                    flat[i : i + n], encoding, factor, clip, scratch, out[i : i + n]
                )


def _clipped_scaled(
    x: np.ndarray, encoding: RingEncoding, factor: float, clip: bool, shift: int, s: _Scratch
) -> np.ndarray:
    """``clip(x * factor, -c, c) * 2**(f + shift)`` in float64, as a view of ``s.y``.

    ``clip=False`` skips the clipping; the caller has checked that it is a no-op.
    """
    v = s.y[: x.size]
    c = encoding.coordinate_bound
    scale = 2.0 ** (encoding.frac_bits + shift)
    if clip and x.dtype == np.float32 and factor == 1.0 and float(np.float32(c)) == c:
        # The same values, but clipping before widening moves half the bytes.
        x = np.clip(x, np.float32(-c), np.float32(c), out=s.f32[: x.size])
        clip = False
    np.copyto(v, x)
    np.multiply(v, factor * scale, out=v)  # the product with 2**k is exact
    if clip:
        np.clip(v, -c * scale, c * scale, out=v)
    return v


def _short_significands(x: np.ndarray, encoding: RingEncoding, factor: float, clip: bool) -> bool:
    """True when ``y = clip(x) * 2**f`` is exact in float32: float32 input, no L2 rescaling,
    clipping (if any) to a bound that float32 represents, and ``2**f`` in float32 range."""
    c = encoding.coordinate_bound
    return (
        x.dtype == np.float32
        and factor == 1.0
        and encoding.frac_bits <= 100
        and (not clip or float(np.float32(c)) == c)
    )


def _encode_block_float32(
    x: np.ndarray, encoding: RingEncoding, clip: bool, s: _Scratch, out: np.ndarray
) -> None:
    """b = 32 when :func:`_short_significands` holds, in 4-byte arithmetic throughout.

    ``y = x * 2**f`` and its clipping are exact in float32 (scaling by a power of two; the
    bound ``c * 2**f`` is a float32), so are ``floor(y)`` and ``frac(y) * 2**32``; the
    latter is truncated to ``T`` (uint32), exactly when ``|y| >= 2**-8``, else off by less
    than one unit of ``2**-32`` (or by < ``2**-24`` for ``-2**-25 < y < 0``). Then
    ``r = floor(y) + [U < T]`` as in :func:`_encode_block_float64`.
    """
    n = x.size
    y, floor = s.f32[:n], s.f32b[:n]
    np.multiply(x, np.float32(encoding.scale), out=y)
    if clip:
        bound = np.float32(encoding.coordinate_bound * encoding.scale)
        np.clip(y, -bound, bound, out=y)
    np.floor(y, out=floor)
    np.subtract(y, floor, out=y)
    np.multiply(y, np.float32(2.0**32), out=y)
    # For -2**-25 < y < 0, y - floor(y) = 1 + y rounds to 1.0 and the product to 2**32,
    # which uint32 cannot hold: clamp to the largest float32 below 2**32 (the true value is
    # above it, so the carry probability is off by < 2**-24 units, only for such y).
    np.minimum(y, _BELOW_2_32, out=y)
    threshold = s.u32[:n]
    np.copyto(threshold, y, casting="unsafe")
    carry = s.carry[:n]
    np.less(s.keystream[:n], threshold, out=carry)
    signed = out.view(np.int32)
    np.copyto(signed, floor, casting="unsafe")  # |floor(y)| < 2**31 by the safety check
    np.add(signed, carry, out=signed)


def _encode_block_float64(
    x: np.ndarray, encoding: RingEncoding, factor: float, clip: bool, s: _Scratch, out: np.ndarray
) -> None:
    """Any input, b = 32 or 64: ``r = floor(y) + [U < frac(y) * 2**32]``, ``U`` the keystream
    word as uint32, so ``P(r = floor(y) + 1) = ceil(frac(y) * 2**32) / 2**32``.

    ``floor(y)`` is exact and fits int64 (``|y| < 2**63``); ``frac(y) * 2**32`` is exact but
    for ``-1 < y < 0`` (error <= ``2**-22``, i.e. ``2**-54`` units). For b = 32 the int64
    result is narrowed to its low 32 bits (two's complement).
    """
    y = _clipped_scaled(x, encoding, factor, clip, 0, s)
    floor, u, carry = s.a[: x.size], s.u[: x.size], s.carry[: x.size]
    np.floor(y, out=floor)
    np.subtract(y, floor, out=y)
    np.multiply(y, 2.0**32, out=y)
    np.copyto(u, s.keystream[: x.size])
    np.less(u, y, out=carry)
    signed = out.view(np.int64) if encoding.bits == 64 else s.i64[: x.size]
    np.copyto(signed, floor, casting="unsafe")
    np.add(signed, carry, out=signed)
    if encoding.bits == 32:
        np.copyto(out, signed, casting="unsafe")
