"""Benchmark of sharefl.crypto against its floor, the raw AES-128-CTR keystream.

Prints JSON lines: the machine, the floor, then one line per target with the measured
figure, the target and whether it passed. Run: ``python benchmarks/bench_crypto.py``
(``--strict`` exits 1 when a target is missed; ``--quick`` uses fewer repetitions).

Targets (issue #2):
- mask expansion + accumulate, d = 10^6, b = 32: rate ≥ 60% of the raw keystream rate;
- Shamir: share 2 secrets of 32 bytes to n = 100 at t = 50 in ≤ 20 ms; reconstruct 110
  secrets from 50 shares each in ≤ 50 ms;
- encoding 10^6 float32 with stochastic rounding: ≤ 5× one mask expansion of that length.
No allocator settings are changed (numpy's default allocator; buffers are reused).
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from common import add_smoke_flag, compare, emit, emit_machine, finish, timeit, use_smoke
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from sharefl.crypto import shamir
from sharefl.crypto.encoding import choose_encoding, encode_into
from sharefl.crypto.prg import MaskExpander

D = 1_000_000


def raw_keystream_fn(nbytes: int):
    """The floor: AES-128-CTR keystream of ``nbytes`` into a preallocated buffer."""
    key, nonce = os.urandom(16), os.urandom(16)
    zeros = bytes(nbytes)
    out = bytearray(nbytes + 15)

    def run() -> None:
        Cipher(algorithms.AES(key), modes.CTR(nonce)).encryptor().update_into(zeros, out)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    add_smoke_flag(parser)
    args = parser.parse_args()
    d = 4096 if use_smoke(args) else D
    repeat = 10 if args.quick else 50
    emit_machine("crypto", d=d)
    records = []

    seed = os.urandom(32)
    for bits in (32, 64):
        expander = MaskExpander(bits)
        acc = np.zeros(d, dtype=expander.dtype)
        out = np.empty(d, dtype=expander.dtype)
        floor_fn = raw_keystream_fn(d * bits // 8)
        t_acc, floor = compare(
            lambda e=expander, a=acc: e.accumulate(a, seed, 1), floor_fn, repeat=repeat
        )
        t_exp, floor2 = compare(
            lambda e=expander, o=out: e.expand(seed, d, o), floor_fn, repeat=repeat
        )
        emit(
            {
                "name": f"aes128_ctr_keystream_{d * bits // 8}B",
                "kind": "baseline",
                **floor,
                "gbytes_per_s": d * bits / 8 / floor["best_s"] / 1e9,
            }
        )
        ratio = floor["best_s"] / t_acc["best_s"]
        record = {
            "name": f"mask_accumulate_b{bits}",
            "d": d,
            **t_acc,
            "keystream_best_s": floor["best_s"],
            "rate_vs_keystream": ratio,
            "expand_best_s": t_exp["best_s"],
            "expand_rate_vs_keystream": floor2["best_s"] / t_exp["best_s"],
        }
        if bits == 32:
            record.update(target=">= 0.60 of keystream rate", **{"pass": ratio >= 0.60})
        records.append(record)
        emit(record)

    xs = list(range(1, 101))
    secrets = [os.urandom(32), os.urandom(32)]
    t_split = timeit(lambda: shamir.split_many(secrets, 50, xs), repeat=repeat)
    record = {
        "name": "shamir_share_2x32B_n100_t50",
        **t_split,
        "target": "<= 0.020 s",
        "pass": t_split["median_s"] <= 0.020,
    }
    records.append(record)
    emit(record)

    many = [os.urandom(32) for _ in range(110)]
    shares = shamir.split_many(many, 50, xs)
    holders = xs[10:60]  # 50 surviving share holders
    rows = [[s.y for s in per_secret[10:60]] for per_secret in shares]

    def reconstruct() -> list[int]:
        return shamir.Reconstructor(holders, 50).reconstruct_many(rows)

    assert [v.to_bytes(32, "big") for v in reconstruct()] == many
    t_rec = timeit(reconstruct, repeat=repeat)
    record = {
        "name": "shamir_reconstruct_110_from_50",
        **t_rec,
        "target": "<= 0.050 s",
        "pass": t_rec["median_s"] <= 0.050,
    }
    records.append(record)
    emit(record)

    encoding = choose_encoding(clip=1.0, max_summands=100, bits=32)
    x = np.random.default_rng(0).standard_normal(d, dtype=np.float32)
    enc_out = np.empty(d, dtype=np.uint32)
    rng = np.random.default_rng(1)
    expander = MaskExpander(32)
    mask_out = np.empty(d, dtype=np.uint32)
    t_enc, t_mask = compare(
        lambda: encode_into(x, encoding, rng, enc_out),
        lambda: expander.expand(seed, d, mask_out),
        repeat=repeat,
    )
    ratio = t_enc["best_s"] / t_mask["best_s"]
    record = {
        "name": "encode_1e6_float32_stochastic",
        **t_enc,
        "mask_expand_best_s": t_mask["best_s"],
        "time_vs_mask_expansion": ratio,
        "frac_bits": encoding.frac_bits,
        "target": "<= 5x one mask expansion",
        "pass": ratio <= 5.0,
    }
    records.append(record)
    emit(record)
    finish(records, strict=args.strict)


if __name__ == "__main__":
    main()
