"""Model lines, versions, aliases and references."""

import threading
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from service.config import Settings
from service.db import create_db_engine, create_session_factory, session_scope
from service.errors import Conflict, InvalidInput, NotFound
from service.migrate import upgrade
from service.projects.service import create_project
from service.registry.models import ModelVersion
from service.registry.schemas import ModelVersionRead
from service.registry.service import (
    create_line,
    get_line,
    list_versions,
    register_version,
    resolve_reference,
    set_alias,
)
from tests.service.conftest import in_default_project, postgres_schema


@pytest.fixture
def register(session, store, onnx_file):
    """Registers a linear classifier as `line:version`."""

    def register_as(line: str, version: str, *, num_classes: int = 3, seed: int = 0, **extra):
        return register_version(session=session, store=store, line_name=line, version=version,
                                onnx_path=onnx_file(num_classes, seed), **extra)

    return register_as


def test_first_version_creates_the_line_and_stores_the_input_spec(session, store, register):
    version = register("digits", "1.0", metadata={"owner": "vision"},
                       produced_by={"method": "elodi", "seed": 3})
    line = get_line(session=session, name="digits")
    assert (line.num_classes, version.line_id) == (3, line.id)
    assert (version.input_name, version.input_shape, version.num_classes) == ("x", [None, 4], 3)
    assert store.exists(version.artifact_sha256)
    read = ModelVersionRead.model_validate(version)
    assert read.metadata == {"owner": "vision"} and read.produced_by["seed"] == 3
    assert read.created_at.tzinfo is not None


def test_version_strings_are_unique_per_line(session, register):
    register("digits", "1.0")
    with pytest.raises(Conflict) as refused:
        register("digits", "1.0", seed=1)
    assert refused.value.code == "version_exists" and refused.value.status_code == 409
    register("letters", "1.0")
    assert [v.version for v in list_versions(session=session, line_name="digits")] == ["1.0"]


def test_a_version_holds_its_lines_project_and_no_other(session, register):
    """A version takes its line's project even when made with another one, and the database
    refuses to move a version out of its line's project."""
    line = register("digits", "1.0").line
    other = create_project(session=session, name="team-b")
    version = ModelVersion(line=line, version="1.1", num_classes=3, project_id=other.id)
    session.add(version)
    session.flush()
    assert version.project_id == line.project_id != other.id
    with pytest.raises(IntegrityError), session.begin_nested():
        session.execute(text("UPDATE model_versions SET project_id = :other WHERE id = :id"),
                        {"other": other.id, "id": version.id})


def test_a_version_must_have_the_line_s_class_count(register):
    register("digits", "1.0", num_classes=3)
    with pytest.raises(InvalidInput) as refused:
        register("digits", "2.0", num_classes=5)
    assert refused.value.code == "class_count_mismatch"


def test_library_refusals_become_service_errors(session, store, tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a protobuf")
    with pytest.raises(InvalidInput) as refused:
        register_version(session=session, store=store, line_name="digits", version="1",
                         onnx_path=broken)
    assert (refused.value.code, refused.value.status_code) == ("onnx_corrupt", 422)


@pytest.mark.parametrize("name", ["", "a:b", "a@b", "../x", "-lead", "x" * 101])
def test_names_that_would_break_references_are_refused(register, name):
    with pytest.raises(InvalidInput):
        register(name, "1.0")


def test_lines_need_one_name_per_class(session):
    with pytest.raises(InvalidInput):
        create_line(session=session, name="pets", num_classes=3, class_names=["cat", "dog"])
    line = create_line(session=session, name="pets", num_classes=2, class_names=["cat", "dog"])
    assert line.class_names == ["cat", "dog"]


def test_aliases_move_and_references_resolve(session, register):
    first, second = register("digits", "1.0"), register("digits", "1.1", seed=1)
    set_alias(session=session, line_name="digits", alias="production", version="1.0")
    assert resolve_reference(session=session, reference="digits@production") is first
    alias = set_alias(session=session, line_name="digits", alias="production", version="1.1")
    assert alias.version_id == second.id
    assert resolve_reference(session=session, reference="digits@production") is second
    assert resolve_reference(session=session, reference="digits:1.0") is first


def test_a_parent_is_named_by_reference(register):
    parent = register("digits", "1.0")
    child = register("digits", "2.0", seed=1, parent="digits:1.0")
    assert child.parent_id == parent.id


@pytest.mark.parametrize(("reference", "error"), [
    ("digits@staging", NotFound), ("digits:9", NotFound), ("nope:1.0", NotFound),
    ("digits", InvalidInput), ("digits:1:0", InvalidInput),
])
def test_bad_references_are_refused(session, register, reference, error):
    register("digits", "1.0")
    with pytest.raises(error):
        resolve_reference(session=session, reference=reference)


@pytest.fixture(params=["sqlite", "postgresql"])
def own_engine(request, tmp_path) -> Iterator[Engine]:
    """A migrated database of this test's own (what it commits is dropped with it)."""
    with ExitStack() as stack:
        url = (f"sqlite:///{tmp_path / 'own.db'}" if request.param == "sqlite"
               else stack.enter_context(postgres_schema()))
        settings = Settings(database_url=url, data_dir=tmp_path)
        upgrade(settings)
        engine = create_db_engine(settings)
        stack.callback(engine.dispose)
        yield engine


def test_concurrent_first_registrations_of_a_line_both_succeed(own_engine, store, onnx_file):
    """The second request, whose line insert waits for the first's uncommitted one, reads
    the line the first committed instead of answering a spurious 409 `line_exists`."""
    sessions, line = create_session_factory(own_engine), "digits"
    models = onnx_file(3, 0), onnx_file(3, 1)
    first = in_default_project(sessions())
    created = register_version(session=first, store=store, line_name=line, version="1",
                               onnx_path=models[0])
    seen: dict[str, object] = {}

    def second() -> None:
        try:
            with session_scope(sessions) as session:
                seen["line_id"] = register_version(session=in_default_project(session), store=store,
                                                   line_name=line, version="2",
                                                   onnx_path=models[1]).line_id
        except Exception as error:  # reported below, on the test's thread
            seen["error"] = error

    racer = threading.Thread(target=second)
    racer.start()
    racer.join(0.5)  # it waits for the first transaction (its line, or SQLite's lock)
    first.commit()
    racer.join(30)
    line_id = created.line_id
    first.close()
    assert seen == {"line_id": line_id}
