"""Sans-I/O protocol: message types, the canonical codec, the signed envelope, ids, topics, verdict errors.

Nothing here reads a clock, a socket or a global RNG; time and seen-sets arrive as arguments.
"""
