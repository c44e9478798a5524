"""A real gRPC client that misbehaves in one chosen way (test helper, also a script).

``python tests/byzantine_client.py --server HOST:PORT --id N --attack NAME [--keys DIR]``
runs one :class:`ByzantineClient` until the server ends its stream, then prints how it
ended on stderr and exits 0 (being thrown out is the expected outcome of most attacks).
The attacks (:data:`ATTACKS`) start with the first cluster and repeat in every round:

- ``low-order-key``: advertises an order-8 X25519 point as its encryption key;
- ``oversized-field``: advertises with a 3 MB signature field (under gRPC's 4 MiB limit);
- ``equal-keys``: advertises the same public key for encryption and masking;
- ``bad-signature``: signs its advertisement with random bytes (signed mode);
- ``wrong-commitment``: commits to a seed other than the one it shares;
- ``undecodable``: sends bytes that are not a protobuf ``ClientMessage`` instead of its
  encrypted shares (mid-round);
- ``false-complaint``: complains about an honest peer's share bundle in its masked input,
  with a made-up pair seed (so its own cluster's sum is corrupted, the peer stays in);
- ``out-of-range``: masks ``2^(b-1)`` in every coordinate, so its cluster's sum decodes
  outside the honest range ``[-m·clip, m·clip]`` whatever its 3 honest peers sent.

In signed mode every other tampered advertisement is signed again, as a real attacker would.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys

import grpc

from sharefl.deploy import wire
from sharefl.deploy.client import ClientRuntime
from sharefl.proto import sharefl_pb2 as pb
from sharefl.protocol.client import ClientPolicy

ORDER_8_POINT = bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800")
GARBAGE = b"\xff\xff\xff\xff\x0fnot a ClientMessage"
ATTACKS = (
    "low-order-key",
    "oversized-field",
    "equal-keys",
    "bad-signature",
    "wrong-commitment",
    "undecodable",
    "false-complaint",
    "out-of-range",
)


class ByzantineClient(ClientRuntime):
    """A :class:`ClientRuntime` that runs ``attack`` (one of :data:`ATTACKS`) in every
    cluster it is assigned to; everything else it does honestly."""

    def __init__(self, *args, attack: str, **kwargs) -> None:
        if attack not in ATTACKS:
            raise ValueError(f"unknown attack {attack!r}; use one of {ATTACKS}")
        # A Byzantine client joins whatever plan it is offered, with atoms or without.
        kwargs.setdefault("policy", ClientPolicy(require_atoms=False))
        super().__init__(*args, **kwargs)
        self.attack = attack
        self._members: tuple[int, ...] = ()
        self._last_advert: pb.Advertisement | None = None

    async def _start_cluster(self, call, proto: pb.ClusterAssignment, update, round_guard):
        self._members = tuple(int(m) for m in proto.members)
        session = await super()._start_cluster(call, proto, update, round_guard)
        if session is None:
            return None
        if self._last_advert is not None:  # keep its own view equal to what it sent
            with contextlib.suppress(wire.WireError):  # an advert too malformed to parse
                session._advert = wire.advert_from_proto(self._last_advert)
        if self.attack == "out-of-range":
            session._vector[:] = 1 << (proto.bits - 1)
        return session

    def _send(self, call, message: pb.ClientMessage | bytes):
        if isinstance(message, bytes):  # a vector's chunk, serialized once by the runtime
            return super()._send(call, message)
        kind = message.WhichOneof("body")
        if kind == "advertise":
            message = self._tampered_advert(message)
        elif kind == "shares" and self.attack == "undecodable":
            return call.write(GARBAGE)
        elif kind == "masked" and self.attack == "false-complaint":
            victim = min(m for m in self._members if m != self.client_id)
            message.masked.complaints.append(victim)
        return super()._send(call, message)

    def _tampered_advert(self, message: pb.ClientMessage) -> pb.ClientMessage:
        advert = message.advertise
        if self.attack == "low-order-key":
            advert.encryption_public = ORDER_8_POINT
        elif self.attack == "oversized-field":
            advert.signature = b"s" * 3_000_000
        elif self.attack == "equal-keys":
            advert.mask_public = advert.encryption_public
        elif self.attack == "bad-signature":
            advert.signature = os.urandom(64)
        elif self.attack == "wrong-commitment":
            advert.commitment = os.urandom(32)
        if advert.signature and self.attack not in ("bad-signature", "oversized-field"):
            advert.signature = self.identity.sign(wire.advert_from_proto(advert).statement())
        self._last_advert = pb.Advertisement.FromString(advert.SerializeToString())
        return message


def main(argv: list[str] | None = None) -> int:
    from sharefl.launch import client_runtime

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--id", type=int, required=True)
    parser.add_argument("--attack", required=True, choices=ATTACKS)
    parser.add_argument("--keys", default=None)
    args = parser.parse_args(argv)
    honest = client_runtime(args.id, args.server, keys=args.keys, retries=3, atoms=False)
    client = ByzantineClient(
        args.id,
        args.server,
        attack=args.attack,
        identity=honest.identity,
        policy=honest.policy,
        tls=honest.tls,
        retries=3,
    )
    try:
        report = asyncio.run(client.run())
        print(f"attacker {args.id}: finished {report.rounds} rounds", file=sys.stderr)
    except grpc.aio.AioRpcError as exc:
        print(f"attacker {args.id}: ended: {exc.code().name}: {exc.details()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
