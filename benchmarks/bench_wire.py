#!/usr/bin/env python3
"""Envelope encode+sign and decode+verify rates for a typical RolloutSubmission.

Baseline, measured in the same run: bare msgpack pack/unpack of the same body. The ratios say what
canonical validation and secp256k1 signatures cost on top of serialisation: seal and open against
pack and unpack, and the canonical codec alone (encode, decode) against the same baselines. The
ceiling ratios are what seal and open would reach if the codec cost nothing (keccak256 of the body
and one signature or recovery only): the bound no codec work can pass.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarmnode.crypto.hashing import keccak256  # noqa: E402
from swarmnode.crypto.signing import recover_address  # noqa: E402
from swarmnode.protocol.codec import decode, encode, to_wire  # noqa: E402
from swarmnode.protocol.envelope import ReplayWindow, open_envelope, seal  # noqa: E402
from swarmnode.protocol.messages import RolloutSubmission  # noqa: E402
from tests.conformance.keys import NOW_MS, RUN, vector_identity  # noqa: E402
from tests.conformance.samples import rollout_submission  # noqa: E402


def best_rates(fns: dict[str, Callable[[], object]],
               rounds: int = 5, seconds: float = 0.3) -> dict[str, float]:
    """Calls per second of each fn: the best of `rounds` short runs taken in turn, so that load from other
    processes on a shared machine hits every measurement alike instead of skewing one ratio."""
    best = dict.fromkeys(fns, 0.0)
    for _ in range(rounds):
        for name, fn in fns.items():
            calls, start = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - start) < seconds:
                fn()
                calls += 1
            best[name] = max(best[name], calls / elapsed)
    return best


def main() -> None:
    identity = vector_identity(1)
    # A typical worker submission: 4 prompts x 8 completions of 64 tokens (2 TOPLOC proofs each).
    submission = rollout_submission(groups=4, group_size=8)
    body_wire = to_wire(submission)
    packed = msgpack.packb(body_wire, use_bin_type=True)
    sealed = seal(identity, submission, run=RUN, seq=1, ts=NOW_MS)
    counter = iter(range(2, 10**9))
    body = encode(submission)
    # The fixed costs inside seal and open that no codec can shrink: the body's keccak256, one signature.
    digest = keccak256(body)
    signature = identity.sign(digest)
    rates = best_rates({
        "pack": lambda: msgpack.packb(body_wire, use_bin_type=True),
        "unpack": lambda: msgpack.unpackb(packed, raw=False),
        "seal": lambda: seal(identity, submission, run=RUN, seq=next(counter), ts=NOW_MS),
        "open": lambda: open_envelope(sealed, run=RUN, now_ms=NOW_MS, replay=ReplayWindow()),
        "encode": lambda: encode(submission),
        "decode": lambda: decode(RolloutSubmission, body),
        "keccak": lambda: keccak256(body),
        "sign": lambda: identity.sign(digest),
        "recover": lambda: recover_address(digest, signature),
    })
    pack_rate, unpack_rate, seal_rate = rates["pack"], rates["unpack"], rates["seal"]
    open_rate, encode_rate, decode_rate = rates["open"], rates["encode"], rates["decode"]
    keccak_rate, sign_rate, recover_rate = rates["keccak"], rates["sign"], rates["recover"]
    seal_fixed_us = 1e6 / keccak_rate + 1e6 / sign_rate
    open_fixed_us = 1e6 / keccak_rate + 1e6 / recover_rate

    print(f"RolloutSubmission body {len(packed)} bytes, envelope {len(sealed)} bytes")
    print(f"bare msgpack pack    {pack_rate:10.0f}/s   unpack        {unpack_rate:10.0f}/s")
    print(f"canonical encode     {encode_rate:10.0f}/s   decode        {decode_rate:10.0f}/s")
    print(f"envelope encode+sign {seal_rate:10.0f}/s   decode+verify {open_rate:10.0f}/s")
    print(f"fixed: keccak256(body) {1e6 / keccak_rate:.0f} us, sign {1e6 / sign_rate:.0f} us, "
          f"recover {1e6 / recover_rate:.0f} us")
    print(json.dumps({
        "body_bytes": len(packed),
        "envelope_bytes": len(sealed),
        "msgpack_pack_per_s": round(pack_rate),
        "msgpack_unpack_per_s": round(unpack_rate),
        "seal_per_s": round(seal_rate),
        "open_per_s": round(open_rate),
        "seal_vs_pack_ratio": round(seal_rate / pack_rate, 4),
        "open_vs_unpack_ratio": round(open_rate / unpack_rate, 4),
        "encode_per_s": round(encode_rate),
        "decode_per_s": round(decode_rate),
        "encode_vs_pack_ratio": round(encode_rate / pack_rate, 4),
        "decode_vs_unpack_ratio": round(decode_rate / unpack_rate, 4),
        "keccak_body_us": round(1e6 / keccak_rate, 1),
        "sign_us": round(1e6 / sign_rate, 1),
        "recover_us": round(1e6 / recover_rate, 1),
        # What seal and open would reach against the baselines if encoding and decoding cost nothing.
        "seal_fixed_us": round(seal_fixed_us, 1),
        "open_fixed_us": round(open_fixed_us, 1),
        "seal_ceiling_vs_pack_ratio": round(1e6 / seal_fixed_us / pack_rate, 4),
        "open_ceiling_vs_unpack_ratio": round(1e6 / open_fixed_us / unpack_rate, 4),
    }))


if __name__ == "__main__":
    main()
