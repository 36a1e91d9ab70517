"""Registering model lines and versions, moving aliases and resolving references."""

import re
from pathlib import Path
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session, contains_eager

from flipgate.formats.onnx_models import external_data_names, inspect_onnx
from flipgate.model_zip import unpack_model_zip
from flipgate.onnx_io import InputSpec, OutputSpec, check_thresholds
from service.datasets.models import Dataset, DatasetRole
from service.db import insert_or_conflict, one_or_not_found
from service.errors import Conflict, InvalidInput, NotFound, library_input
from service.names import VERSION, check_name
from service.registry.models import Alias, ModelLine, ModelVersion
from service.storage import BUNDLE_MODEL, ArtifactStore, model_sha256

ZIP_MAGIC = b"PK\x03\x04"
REFERENCE = re.compile(r"(?P<line>[^:@]+)(?P<separator>[:@])(?P<name>[^:@]+)")
PRODUCTION = "production"  # the alias that only the deploy gate's approvals move


def create_line(*, session: Session, name: str, num_classes: int,
                class_names: list[str] | None = None, multilabel: bool = False) -> ModelLine:
    """Create a model line under a new name (`multilabel`: of `num_classes` labels)."""
    check_name(name, "line_name")
    if num_classes < 2 or (class_names is not None and len(class_names) != num_classes):
        raise InvalidInput("invalid_classes", f"a line needs at least 2 classes and one name "
                           f"per class, got {num_classes} classes and names {class_names}")
    line = ModelLine(name=name, num_classes=num_classes, class_names=class_names,
                     multilabel=multilabel)
    return insert_or_conflict(session, line, code="line_exists",
                              message=f"model line {name!r} already exists")


def list_lines(*, session: Session) -> list[ModelLine]:
    """Every model line, by name."""
    return list(session.scalars(select(ModelLine).order_by(ModelLine.name)))


def get_line(*, session: Session, name: str) -> ModelLine:
    """The model line called `name`."""
    return one_or_not_found(session, select(ModelLine).where(ModelLine.name == name),
                            code="line_not_found", message=f"no model line {name!r}")


def register_version(
    *, session: Session, store: ArtifactStore, line_name: str, version: str, onnx_path: Path,
    parent: str | None = None, produced_by: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None, source: str | None = None,
    output: str | None = None, scores: str | None = None, multilabel: bool | None = None,
    thresholds: list[float] | None = None,
) -> ModelVersion:
    """Store an ONNX classifier as a new version of a line, creating the line on first use;
    its scores are read from `output` as `scores` (chosen and detected from the graph when
    None). The line takes the class names the model carries; versions must agree on them.
    A multi-label line (made so by its first version's `multilabel`) reads one score per
    label; its versions decide at `thresholds`, else at those the model's metadata declares.
    The row is inserted before the file enters the store: a refusal leaves nothing behind."""
    check_name(version, "version", VERSION)
    multilabel = line_kind(session=session, name=line_name, multilabel=multilabel)
    with library_input():
        spec = inspect_onnx(onnx_path, source=source, output=output, scores=scores,
                            multilabel=multilabel)
        files = model_files(onnx_path, source=source)
    line = _line_with_classes(session=session, name=line_name, num_classes=spec.num_classes,
                              multilabel=multilabel)
    _check_input_signature(session=session, line=line, inputs=spec.inputs)
    _take_class_names(line, model_class_names(spec.output))
    row = ModelVersion(
        line=line,
        version=version, artifact_sha256=model_sha256(files),
        input_name=spec.input_name, input_shape=list(spec.input_shape),
        inputs=[input_spec.as_json() for input_spec in spec.inputs],
        num_classes=spec.num_classes, scores_output=spec.output_name,
        scores_kind=spec.output.kind, produced_by=produced_by, meta=metadata or {},
        parent=_parent(session, parent, line),
        thresholds=version_thresholds(line, thresholds or spec.thresholds),
    )
    insert_or_conflict(session, row, code="version_exists",
                       message=f"version {line_name}:{version} already exists")
    store.put_model(files, row.artifact_sha256)
    return row


def register_external_version(
    *, session: Session, line_name: str, version: str, num_classes: int | None,
    parent: str | None = None, metadata: dict[str, Any] | None = None,
    multilabel: bool | None = None, thresholds: list[float] | None = None,
) -> ModelVersion:
    """Register a version without a model file (an LLM prompt, a remote API, another
    runtime): its predictions arrive only by upload. A new line needs `num_classes` (its
    labels' count, with `multilabel`); a multi-label version decides at `thresholds`."""
    check_name(version, "version", VERSION)
    multilabel = line_kind(session=session, name=line_name, multilabel=multilabel)
    line = _external_line(session=session, name=line_name, num_classes=num_classes,
                          multilabel=multilabel)
    row = ModelVersion(
        line=line, version=version, num_classes=line.num_classes, meta=metadata or {},
        parent=_parent(session, parent, line), thresholds=version_thresholds(line, thresholds),
    )
    return insert_or_conflict(session, row, code="version_exists",
                              message=f"version {line_name}:{version} already exists")


def _parent(session: Session, reference: str | None, line: ModelLine) -> ModelVersion | None:
    """The version `reference` names ("line:version", "line@alias", or a bare version of
    `line`), which must be of `line` (a parent is an earlier version of the same line)."""
    if reference is None:
        return None
    if VERSION.fullmatch(reference):
        return get_named_version(session=session, line_name=line.name, version=reference)
    parent = resolve_reference(session=session, reference=reference)
    if parent.line_id != line.id:
        raise InvalidInput("parent_not_in_line", f"parent {reference!r} is not a version of "
                           f"line {line.name!r}")
    return parent


def line_kind(*, session: Session, name: str, multilabel: bool | None) -> bool:
    """Whether the line `name` is multi-label: as it is when it exists (a registration that
    says otherwise is refused, `line_kind_mismatch`), else as `multilabel` says."""
    kind = session.scalars(select(ModelLine.multilabel).where(ModelLine.name == name)).first()
    if kind is not None and multilabel is not None and kind != multilabel:
        raise InvalidInput("line_kind_mismatch", f"model line {name!r} is "
                           f"{describe_kind(kind)}; this version says it is "
                           f"{describe_kind(multilabel)}")
    return bool(multilabel) if kind is None else kind


def describe_kind(multilabel: bool) -> str:
    return "multi-label" if multilabel else "single-label"


def version_thresholds(line: ModelLine, thresholds: "list[float] | tuple[float, ...] | None"
                       ) -> list[float] | None:
    """A version's decision thresholds: one number in (0, 1) per label of a multi-label
    line (`invalid_thresholds`); none for a single-label line (`thresholds_need_multilabel`)."""
    if thresholds is None:
        return None
    if not line.multilabel:
        raise InvalidInput("thresholds_need_multilabel", f"model line {line.name!r} is "
                           "single-label: thresholds apply to multi-label lines only")
    with library_input():
        values = list(check_thresholds(list(thresholds), "thresholds"))
    if len(values) != line.num_classes:
        raise InvalidInput("invalid_thresholds", f"{len(values)} thresholds for the "
                           f"{line.num_classes} labels of model line {line.name!r}")
    return values


def _external_line(*, session: Session, name: str, num_classes: int | None,
                   multilabel: bool = False) -> ModelLine:
    """The line of an external version: the named one, or a new one of `num_classes`."""
    exists = session.scalars(select(ModelLine.id).where(ModelLine.name == name)).first()
    if num_classes is None and exists is None:
        raise InvalidInput("num_classes_required", f"model line {name!r} does not exist yet: "
                           "give num_classes (or an artifact) to create it")
    return get_line(session=session, name=name) if num_classes is None else \
        _line_with_classes(session=session, name=name, num_classes=num_classes,
                           multilabel=multilabel)


def model_upload(path: Path, *, max_bytes: int, source: str) -> Path:
    """The .onnx of an uploaded model: the file itself, or the one unpacked (at most
    `max_bytes`) from a model .zip into a new folder beside it."""
    with path.open("rb") as handle:
        if handle.read(len(ZIP_MAGIC)) != ZIP_MAGIC:
            return path
    folder = path.parent / "unpacked"
    folder.mkdir()
    with library_input():
        return unpack_model_zip(path, folder, max_bytes=max_bytes, source=source)


def model_files(onnx_path: Path, *, source: str | None = None) -> dict[str, Path]:
    """The files of a model artifact by their names in the store: the .onnx, and beside it
    the external data files it names (checked by inspect_onnx to lie in its folder)."""
    names = sorted(external_data_names(onnx_path, source=source))
    if BUNDLE_MODEL in names:
        raise InvalidInput("onnx_external_data", f"{source or onnx_path}: external data may "
                           f"not be called {BUNDLE_MODEL!r}")
    return {BUNDLE_MODEL: onnx_path} | {name: onnx_path.parent / name for name in names}


def _line_with_classes(*, session: Session, name: str, num_classes: int,
                       multilabel: bool = False) -> ModelLine:
    """The named line, created on first use (or by a concurrent first use: then it is read,
    not refused); it must have `num_classes` classes (labels, on a multi-label line)."""
    line = session.scalars(select(ModelLine).where(ModelLine.name == name)).one_or_none()
    if line is None:
        try:
            return create_line(session=session, name=name, num_classes=num_classes,
                               multilabel=multilabel)
        except Conflict:  # another request created it meanwhile, and has committed
            line = session.scalars(select(ModelLine).where(ModelLine.name == name)).one()
    if line.multilabel != multilabel:
        raise InvalidInput("line_kind_mismatch", f"model line {name!r} is "
                           f"{describe_kind(line.multilabel)}")
    if line.num_classes != num_classes:
        code, what = (("label_count_mismatch", "labels") if multilabel
                      else ("class_count_mismatch", "classes"))
        raise InvalidInput(code, f"model line {name!r} has {line.num_classes} {what} but "
                           f"the model outputs {num_classes}")
    return line


def _take_class_names(line: ModelLine, names: list[str] | None) -> None:
    """Give the line the class names a model carries, which must agree with its own."""
    if names is None:
        return
    _check_class_names(names, line.num_classes, f"the model's class labels for {line.name!r}")
    if line.class_names is not None and line.class_names != names:
        raise InvalidInput("class_names_mismatch", f"model line {line.name!r} names its "
                           f"classes {line.class_names}, this model {names}")
    line.class_names = names


def set_class_names(*, session: Session, line_name: str, class_names: list[str]) -> ModelLine:
    """Name the classes of a line: one unique, non-empty, printable name per class."""
    line = get_line(session=session, name=line_name)
    _check_class_names(class_names, line.num_classes, f"model line {line_name!r}")
    line.class_names = class_names
    return line


def _check_class_names(names: list[str], count: int, what: str) -> None:
    """`count` unique, non-empty, printable names of at most 256 characters."""
    if len(names) != count or len(set(names)) != len(names) or not all(
            name.strip() and name.isprintable() and len(name) <= 256 for name in names):
        raise InvalidInput("invalid_classes", f"{what}: {count} classes need one unique, "
                           f"non-empty, printable name each, not {names[:20]}")


def _check_input_signature(*, session: Session, line: ModelLine,
                           inputs: tuple[InputSpec, ...]) -> None:
    """Versions of a line can be fed from one eval set holding the union of their inputs: an
    input that two versions name has one per-sample shape (batch axes may differ) and is
    strings in both or in neither. A version may add or drop inputs (a v2 that adds
    token_type_ids); numeric dtypes may differ (each array is cast to its model's input)."""
    if line.id is None:
        return
    ours = {spec.name: spec for spec in inputs}
    stored = session.scalars(select(ModelVersion.inputs).where(
        ModelVersion.line_id == line.id, ModelVersion.artifact_sha256.is_not(None)))
    for theirs in map(InputSpec.from_json, (spec for specs in stored for spec in specs or ())):
        mine = ours.get(theirs.name)
        if mine is not None and mine.signature() != theirs.signature():
            raise InvalidInput("input_signature_mismatch", f"model line {line.name!r}: input "
                               f"{theirs.name!r} is {theirs.describe()} in an earlier version, "
                               f"{mine.describe()} in this model")


def model_class_names(output: OutputSpec) -> list[str] | None:
    """The class names a model carries, unless they are only its column indices."""
    labels = output.class_labels
    if labels is None or labels == tuple(str(column) for column in range(len(labels))):
        return None
    return list(labels)


def get_version(*, session: Session, version_id: int) -> ModelVersion:
    """The version with this id (from the session's identity map when it is loaded)."""
    version = session.get(ModelVersion, version_id)
    if version is None:
        raise NotFound("version_not_found", f"no model version {version_id}")
    return version


def get_named_version(*, session: Session, line_name: str, version: str) -> ModelVersion:
    """The version `line_name:version`, with its line loaded."""
    statement = (select(ModelVersion).join(ModelVersion.line)
                 .options(contains_eager(ModelVersion.line))
                 .where(ModelLine.name == line_name, ModelVersion.version == version))
    return one_or_not_found(session, statement, code="version_not_found",
                            message=f"no model version {line_name}:{version}")


def model_address(version: ModelVersion) -> str:
    """The address of a version's model as it was registered and gated (its .onnx file, or
    the bundle of a model with external data); 404 `version_has_no_model` for an external
    version."""
    if version.external:
        raise NotFound("version_has_no_model", f"version {version.version} is external: "
                       "flipgate has its predictions, not its model")
    return version.artifact_sha256


def list_versions(*, session: Session, line_name: str) -> list[ModelVersion]:
    """The versions of a line, oldest first."""
    line = get_line(session=session, name=line_name)
    statement = select(ModelVersion).where(ModelVersion.line_id == line.id)
    return list(session.scalars(statement.order_by(ModelVersion.id)))


def set_alias(*, session: Session, line_name: str, alias: str, version: str) -> Alias:
    """Point `line_name@alias` at one of the line's versions, creating the alias if new.
    Names that differ from `production` only in case are reserved: no look-alike of the
    gated alias can be made."""
    check_name(alias, "alias")
    if alias.casefold() == PRODUCTION and alias != PRODUCTION:
        raise InvalidInput("alias_reserved", f"alias {alias!r} is reserved: it differs from "
                           f"{PRODUCTION!r}, which only the deploy gate moves, only in case")
    target = get_named_version(session=session, line_name=line_name, version=version)
    named = select(Alias).where(Alias.line_id == target.line_id, Alias.name == alias)
    row = session.scalars(named).one_or_none()
    if row is None:
        try:
            return insert_or_conflict(session, Alias(line_id=target.line_id, name=alias,
                                                     version=target),
                                      code="alias_exists", message=f"{line_name}@{alias} exists")
        except Conflict:  # set first by a concurrent request: this move comes after it
            row = session.scalars(named).one()
    row.version = target
    session.flush()
    return row


def get_alias(*, session: Session, line_name: str, alias: str) -> Alias:
    """The alias `line_name@alias`."""
    statement = (select(Alias).join(ModelLine, ModelLine.id == Alias.line_id)
                 .where(ModelLine.name == line_name, Alias.name == alias))
    return one_or_not_found(session, statement, code="alias_not_found",
                            message=f"no alias {line_name}@{alias}")


def production_aliases() -> Select[tuple[int, int]]:
    """(line id, version id) of every line's production alias; filter it for one line."""
    return select(Alias.line_id, Alias.version_id).where(Alias.name == PRODUCTION)


def production_version_id(*, session: Session, line_id: int, lock: bool = False) -> int | None:
    """The id of the version the line's production alias points at, if any (`lock`: its
    alias row)."""
    statement = production_aliases().where(Alias.line_id == line_id)
    row = session.execute(statement.with_for_update() if lock else statement).one_or_none()
    return None if row is None else row.version_id


def production_version(*, session: Session, line: ModelLine,
                       lock: bool = False) -> ModelVersion | None:
    """The version the line's production alias points at, if any (`lock`: its alias row)."""
    version_id = production_version_id(session=session, line_id=line.id, lock=lock)
    return None if version_id is None else get_version(session=session, version_id=version_id)


def set_training_dataset(*, session: Session, line_name: str, dataset: Dataset) -> ModelLine:
    """Make `dataset` (a training set) the one the line's candidates are retrained on."""
    if dataset.role != DatasetRole.TRAIN:
        raise InvalidInput("not_a_training_set", f"data set {dataset.name!r} is an eval set; "
                           "register training data with POST /trainsets")
    line = get_line(session=session, name=line_name)
    line.training_dataset_id = dataset.id
    session.flush()
    return line


def list_aliases(*, session: Session, line_name: str) -> list[Alias]:
    """The aliases of a line, by name."""
    line = get_line(session=session, name=line_name)
    return list(session.scalars(select(Alias).where(Alias.line_id == line.id).order_by(Alias.name)))


def qualified_name(*, session: Session, version: ModelVersion) -> str:
    """The "line:version" that names a version."""
    return f"{session.get_one(ModelLine, version.line_id).name}:{version.version}"


def get_alias_target(*, session: Session, line_name: str, alias: str) -> ModelVersion:
    """The version that `line_name@alias` points at, with its line loaded."""
    statement = (select(ModelVersion).join(Alias, Alias.version_id == ModelVersion.id)
                 .join(ModelVersion.line).options(contains_eager(ModelVersion.line))
                 .where(ModelLine.name == line_name, Alias.name == alias))
    return one_or_not_found(session, statement, code="alias_not_found",
                            message=f"no alias {line_name}@{alias}")


def resolve_reference(*, session: Session, reference: str) -> ModelVersion:
    """The version named by "line:version" or by "line@alias"."""
    match = REFERENCE.fullmatch(reference)
    if match is None:
        raise InvalidInput("invalid_reference", f"{reference!r} is neither 'line:version' "
                           "nor 'line@alias'")
    line_name, name = match["line"], match["name"]
    if match["separator"] == ":":
        return get_named_version(session=session, line_name=line_name, version=name)
    return get_alias_target(session=session, line_name=line_name, alias=name)


def check_evalset_fits(*, line: ModelLine, dataset: Dataset) -> None:
    """A line is measured on eval sets of its kind (`evalset_kind_mismatch`); a multi-label
    line's sets have its number of labels (`label_count_mismatch`; a traffic set that does
    not name its labels fits any) and, where both name them, its label names
    (`class_names_mismatch`). A traffic set is of the kind it was registered as."""
    if dataset.multilabel != line.multilabel:
        raise InvalidInput("evalset_kind_mismatch", f"eval set {dataset.name!r} is "
                           f"{describe_kind(dataset.multilabel)} but model line {line.name!r} "
                           f"is {describe_kind(line.multilabel)}")
    if not line.multilabel:
        return
    unnamed_traffic = dataset.num_classes is None and not dataset.labeled
    if not unnamed_traffic and dataset.num_classes != line.num_classes:
        raise InvalidInput("label_count_mismatch", f"eval set {dataset.name!r} has "
                           f"{dataset.num_classes} labels but model line {line.name!r} has "
                           f"{line.num_classes}")
    if line.class_names and dataset.label_names and line.class_names != dataset.label_names:
        raise InvalidInput("class_names_mismatch", f"eval set {dataset.name!r} names its "
                           f"labels {dataset.label_names[:20]}, model line {line.name!r} "
                           f"{line.class_names[:20]}")
