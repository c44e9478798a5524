"""PRG mask expansion: a 32-byte seed → a vector in Z_2^b from the AES-CTR keystream.

PRG(seed) is the AES-128-CTR keystream under ``key = seed[:16]`` starting at the counter
block ``seed[16:32]`` (big-endian 128-bit increment, as in NIST SP 800-38A), read as
little-endian uint32 (b = 32) or uint64 (b = 64) words. The byte order is fixed, so masks
are identical on every machine. Seeds must be uniformly random (HKDF outputs or
``os.urandom``); the PRG then has 128-bit security.

The bulk operation of secure aggregation is "add (or subtract) this seed's mask into this
accumulator", so :meth:`MaskExpander.accumulate` fuses it: the keystream is produced in
cache-sized blocks into one reused scratch buffer and added into the accumulator block by
block, never materialising the full mask. :meth:`MaskExpander.expand` writes a mask
straight into the caller's buffer.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes

from sharefl.crypto.errors import PRGError

SEED_BYTES = 32
_AES_BLOCK = 16
_DTYPES = {32: np.dtype("<u4"), 64: np.dtype("<u8")}
DEFAULT_BLOCK_BYTES = 256 * 1024


def ring_dtype(bits: int) -> np.dtype:
    """The native unsigned dtype of Z_2^bits (bits ∈ {32, 64}); raises :class:`PRGError`."""
    if bits not in _DTYPES:
        raise PRGError(f"ring bit width must be 32 or 64, got {bits!r}")
    return np.dtype(np.uint32 if bits == 32 else np.uint64)


def _keystream(seed: bytes) -> CipherContext:
    if not isinstance(seed, bytes | bytearray | memoryview) or len(seed) != SEED_BYTES:
        got = len(seed) if hasattr(seed, "__len__") else type(seed).__name__
        raise PRGError(f"a mask seed is {SEED_BYTES} bytes, got {got}")
    seed = bytes(seed)
    return Cipher(algorithms.AES(seed[:16]), modes.CTR(seed[16:])).encryptor()


class MaskExpander:
    """Expands seeds into masks in Z_2^bits, reusing its scratch buffers across calls.

    Not thread-safe (it owns scratch memory); use one per thread, or the module functions
    :func:`expand_mask` / :func:`accumulate_mask`, which keep one per thread.

    Args:
        bits: 32 or 64, the ring Z_2^bits.
        block_bytes: keystream block size; a multiple of 16 that fits the L2 cache.
    """

    def __init__(self, bits: int = 32, block_bytes: int = DEFAULT_BLOCK_BYTES) -> None:
        self.dtype = ring_dtype(bits)
        self.bits = bits
        if block_bytes <= 0 or block_bytes % _AES_BLOCK:
            raise PRGError(f"block_bytes must be a positive multiple of 16, got {block_bytes}")
        self._block_bytes = block_bytes
        self._zeros = bytes(block_bytes)
        # update_into wants len(out) >= len(in) + 15.
        self._scratch = bytearray(block_bytes + _AES_BLOCK - 1)
        self._scratch_words = np.frombuffer(
            self._scratch,
            dtype=self.dtype.newbyteorder("<"),
            count=block_bytes // self.dtype.itemsize,
        )

    def _check_buffer(self, name: str, array: np.ndarray) -> None:
        if not isinstance(array, np.ndarray) or array.dtype != self.dtype or array.ndim != 1:
            raise PRGError(
                f"{name} must be a 1-D numpy array of dtype {self.dtype} for b = {self.bits}; "
                f"got {getattr(array, 'dtype', type(array).__name__)} "
                f"with shape {getattr(array, 'shape', None)}"
            )
        if not array.flags.c_contiguous or not array.flags.writeable:
            raise PRGError(f"{name} must be C-contiguous and writeable")

    def expand(self, seed: bytes, length: int, out: np.ndarray | None = None) -> np.ndarray:
        """PRG(seed) as ``length`` ring elements, written into ``out`` when given.

        Returns a 1-D array of dtype uint32/uint64 (``out`` itself when given; its length
        must equal ``length``). Raises :class:`PRGError` on a bad seed or buffer.
        """
        if length < 0:
            raise PRGError(f"mask length must be >= 0, got {length}")
        if out is None:
            out = np.empty(length, dtype=self.dtype)
        else:
            self._check_buffer("out", out)
            if out.shape[0] != length:
                raise PRGError(f"out has length {out.shape[0]}, expected {length}")
        stream = _keystream(seed)
        nbytes = length * self.dtype.itemsize
        raw = out.view(np.uint8)
        # Blocks that leave >= 15 bytes after them can be written in place; the tail goes
        # through the scratch buffer.
        pos = 0
        while nbytes - pos >= self._block_bytes + _AES_BLOCK - 1:
            stream.update_into(
                self._zeros, raw[pos : pos + self._block_bytes + _AES_BLOCK - 1].data
            )
            pos += self._block_bytes
        while pos < nbytes:
            take = min(self._block_bytes, nbytes - pos)
            stream.update_into(memoryview(self._zeros)[:take], self._scratch)
            raw[pos : pos + take] = np.frombuffer(self._scratch, np.uint8, count=take)
            pos += take
        if out.dtype.byteorder == ">":  # pragma: no cover - big-endian hosts only
            out.byteswap(inplace=True)
        return out

    def accumulate(self, acc: np.ndarray, seed: bytes, sign: int = 1) -> np.ndarray:
        """``acc ← acc + sign·PRG(seed) (mod 2^bits)`` in place, block by block; returns acc.

        ``sign`` is +1 or −1. Adding then subtracting the same seed restores ``acc``
        exactly, for every length (including 0). Raises :class:`PRGError`.
        """
        self._check_buffer("acc", acc)
        return self.combine(acc, [acc], [(seed, sign)])

    def combine(
        self,
        out: np.ndarray,
        vectors: Sequence[np.ndarray] = (),
        masks: Iterable[tuple[bytes, int]] = (),
    ) -> np.ndarray:
        """``out ← Σ vectors + Σ sign·PRG(seed)`` (mod 2^bits) over ``masks = [(seed, sign)]``.

        What a client does to mask its input (one vector, its self mask and one mask per
        peer) and what the server does to unmask a cluster (the survivors' vectors, minus
        their self masks, ± the pairwise masks of dropped clients). Computed block by block
        with one keystream per seed kept open, so each output block stays in cache while
        every vector and mask is added into it: the output is written once instead of once
        per mask. ``out`` may be one of ``vectors`` only if it is the first. Raises
        :class:`PRGError` on a bad buffer, vector, seed or sign.
        """
        self._check_buffer("out", out)
        for vector in vectors:
            if vector.dtype != self.dtype or vector.shape != out.shape:
                raise PRGError(
                    f"vectors must be {self.dtype} of shape {out.shape}; got {vector.dtype} "
                    f"{vector.shape}"
                )
        streams = []
        for seed, sign in masks:
            if sign not in (1, -1):
                raise PRGError(f"sign must be +1 or -1, got {sign!r}")
            streams.append((_keystream(seed), np.add if sign == 1 else np.subtract))
        words_per_block = self._scratch_words.shape[0]
        zeros = memoryview(self._zeros)
        itemsize = self.dtype.itemsize
        for start in range(0, out.shape[0], words_per_block):
            stop = min(start + words_per_block, out.shape[0])
            count = stop - start
            block = out[start:stop]
            if vectors:
                if vectors[0] is not out:
                    np.copyto(block, vectors[0][start:stop])
                for vector in vectors[1:]:
                    np.add(block, vector[start:stop], out=block)
            else:
                block.fill(0)
            words = self._scratch_words[:count]
            for stream, op in streams:
                stream.update_into(zeros[: count * itemsize], self._scratch)
                op(block, words, out=block)
        return out


_local = threading.local()


def _expander(bits: int) -> MaskExpander:
    cache: dict[int, MaskExpander] | None = getattr(_local, "expanders", None)
    if cache is None:
        cache = _local.expanders = {}
    if bits not in cache:
        cache[bits] = MaskExpander(bits)
    return cache[bits]


def expand_mask(
    seed: bytes, length: int, bits: int = 32, out: np.ndarray | None = None
) -> np.ndarray:
    """PRG(seed) as a vector of ``length`` elements of Z_2^bits (see :class:`MaskExpander`)."""
    return _expander(bits).expand(seed, length, out)


def _bits_of(array: np.ndarray, name: str) -> int:
    bits = array.dtype.itemsize * 8 if isinstance(array, np.ndarray) else 0
    if bits not in _DTYPES:
        raise PRGError(f"{name} must be a uint32 or uint64 numpy array, got {type(array).__name__}")
    return bits


def accumulate_mask(acc: np.ndarray, seed: bytes, sign: int = 1) -> np.ndarray:
    """``acc ← acc ± PRG(seed)`` in place; b is taken from acc's dtype (uint32 or uint64)."""
    return _expander(_bits_of(acc, "acc")).accumulate(acc, seed, sign)


def combine_masks(
    out: np.ndarray, vectors: Sequence[np.ndarray] = (), masks: Iterable[tuple[bytes, int]] = ()
) -> np.ndarray:
    """``out ← Σ vectors + Σ sign·PRG(seed)``, fused block by block (see
    :meth:`MaskExpander.combine`); b is taken from out's dtype."""
    return _expander(_bits_of(out, "out")).combine(out, vectors, masks)
