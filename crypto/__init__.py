"""Cryptography for swarmnode: node identity, signatures, hashing, Merkle trees, TOPLOC proofs.

Everything here is pure: keys, digests and randomness arrive as arguments.
"""
