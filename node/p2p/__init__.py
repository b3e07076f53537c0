"""The node's networking on py-libp2p: host, DHT discovery, gossip, request/response, peer scoring.

Each module wraps one py-libp2p default that is unsafe or silently lossy for a swarm (see its docstring),
and exposes `statistics()` so every drop and rejection is counted.
"""
