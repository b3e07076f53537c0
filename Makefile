# The two entry points a new machine needs; each installs first (scripts/install.sh).
.PHONY: devnet test vectors bench
devnet:
	scripts/devnet.sh
test:
	scripts/test.sh
vectors:
	.venv/bin/python scripts/gen_vectors.py
bench:
	for b in benchmarks/bench_*.py; do .venv/bin/python $$b; done
