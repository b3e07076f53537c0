"""The table of suites (node/conformance.py) covers every vector directory under spec/, so a new suite cannot
be forgotten by `swarmnode conformance` or by `make vectors`."""

from __future__ import annotations

import json

from click.testing import CliRunner

from scripts.gen_vectors import VECTORS, generators_of
from swarmnode.node.cli.main import main
from swarmnode.node.conformance import SUITES, load, suite_named

SPEC = VECTORS.parent


def test_every_vector_directory_under_spec_is_one_suite() -> None:
    directories = {path.parent.relative_to(VECTORS).as_posix() for path in VECTORS.rglob("*.json")}
    assert {"." if s.directory == "" else s.directory for s in SUITES} == directories
    assert len({s.name for s in SUITES}) == len(SUITES) == len({s.directory for s in SUITES})
    outside = [p for p in SPEC.rglob("*.json") if VECTORS not in p.parents]
    assert outside == [], "vector files outside spec/vectors: give them a suite there"


def test_every_committed_file_is_a_generated_document_with_handled_kinds() -> None:
    for suite in SUITES:
        names = set(generators_of(suite))
        files = {path.name for path in suite.folder(VECTORS).glob("*.json")}
        assert files == {suite.file_for(VECTORS, name).name for name in names}, suite.name
        for document, cases in load(suite, VECTORS):
            assert document in names and cases, (suite.name, document)
            assert {c["kind"] for c in cases} <= set(suite.handlers), (suite.name, document)


def test_a_kind_belongs_to_one_suite() -> None:
    kinds = [kind for suite in SUITES for kind in suite.handlers]
    assert len(kinds) == len(set(kinds))


def test_cli_lists_the_suites_and_replays_one() -> None:
    listed = CliRunner().invoke(main, ["conformance", "--list"])
    assert listed.exit_code == 0 and all(s.name in listed.output for s in SUITES), listed.output
    one = CliRunner().invoke(main, ["conformance", "--suite", "shards"])
    total = sum(len(cases) for _, cases in load(suite_named("shards"), VECTORS))
    assert one.exit_code == 0 and f"all {total} cases passed" in one.output, one.output
    assert "shards-manifest" in one.output and "diloco-run" not in one.output
    unknown = CliRunner().invoke(main, ["conformance", "--suite", "nope"])
    assert unknown.exit_code != 0 and "no conformance suite 'nope'" in unknown.output


def test_a_suite_folder_under_another_root_is_replayed_there(tmp_path) -> None:
    """`--vectors DIR` reads DIR laid out as spec/vectors: a file under DIR/diloco/ is a diloco document."""
    source = suite_named("diloco").file_for(VECTORS, "diloco-route")
    document = json.loads(source.read_text())
    document["cases"][0]["expect"] = {"status": 200}
    (tmp_path / "diloco").mkdir()
    (tmp_path / "diloco" / source.name).write_text(json.dumps(document))
    result = CliRunner().invoke(main, ["conformance", "--vectors", str(tmp_path)])
    assert result.exit_code != 0 and "FAIL diloco-route" in result.output, result.output
