"""A hostile peer beside a working devnet (issue 14): the attacker process and the victims' meters."""
