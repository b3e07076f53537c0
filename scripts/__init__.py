"""Project scripts: a package, so tests import the generators (scripts.gen_vectors, gen_messages_spec)."""
