"""ORM model of the compare report of one (old, new, data set) triple."""

from typing import Any

from sqlalchemy import CheckConstraint, ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from service.datasets.models import Dataset
from service.db import Base, Record
from service.registry.models import ModelVersion


class PairMetrics(Record, Base):
    """Every scalar of `flipgate compare --json` as a column, and the whole report as JSON;
    on a traffic set, a report per label revision (the columns that need labels null until
    they are known)."""

    __tablename__ = "pair_metrics"
    __table_args__ = (UniqueConstraint("old_version_id", "new_version_id", "dataset_id",
                                       "label_revision"),
                      CheckConstraint("old_version_id <> new_version_id", name="distinct"))

    old_version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"))
    new_version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"))
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"), index=True)
    n: Mapped[int]
    er_old: Mapped[float | None]
    er_new: Mapped[float | None]
    nfr: Mapped[float | None]
    pfr: Mapped[float | None]
    rel_nfr: Mapped[float | None]
    nfi: Mapped[float | None]
    btc: Mapped[float | None]
    bec: Mapped[float | None]
    churn: Mapped[float]
    churn_old_correct: Mapped[float | None]
    churn_old_incorrect: Mapped[float | None]
    schurn: Mapped[float | None]  # None when a side has predicted labels only
    negative_flips: Mapped[int | None]
    positive_flips: Mapped[int | None]
    both_wrong: Mapped[int | None]
    nfr_ci_low: Mapped[float | None]
    nfr_ci_high: Mapped[float | None]
    mcnemar_p: Mapped[float | None]
    report: Mapped[dict[str, Any]]
    html_sha256: Mapped[str | None] = mapped_column(String(64))  # the HTML page the job drew
    label_revision: Mapped[int] = mapped_column(default=0, server_default="0")
    export_sha256: Mapped[str | None] = mapped_column(String(64))  # a traffic set's export


    old_version: Mapped[ModelVersion] = relationship(foreign_keys=old_version_id, lazy="raise")
    new_version: Mapped[ModelVersion] = relationship(foreign_keys=new_version_id, lazy="raise")
    dataset: Mapped[Dataset] = relationship(lazy="raise")


REPORT_SCALARS = ("n", "er_old", "er_new", "nfr", "pfr", "rel_nfr", "nfi", "btc", "bec", "churn",
                  "churn_old_correct", "churn_old_incorrect", "schurn", "negative_flips",
                  "positive_flips", "both_wrong", "mcnemar_p")


class PairCounts(Record, Base):
    """The exact counts behind two cells of a line's matrix (old → new and new → old): an
    unordered pair of versions, the lower id first, on a data set. NFR, PFR and churn of
    either direction are a count over n (`rates`)."""

    __tablename__ = "pair_counts"
    __table_args__ = (UniqueConstraint("first_version_id", "second_version_id", "dataset_id"),
                      CheckConstraint("first_version_id < second_version_id", name="ordered"))

    first_version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"))
    second_version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"))
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"), index=True)
    n: Mapped[int]
    only_first_right: Mapped[int]  # samples the first version gets right and the second wrong
    only_second_right: Mapped[int]  # samples the second version gets right and the first wrong
    differ: Mapped[int]  # samples the two versions predict differently

    def rates(self, old_version_id: int) -> dict[str, float]:
        """NFR, PFR and churn of the update from `old_version_id` to the pair's other version."""
        lost, gained = self.only_first_right, self.only_second_right
        if old_version_id == self.second_version_id:
            lost, gained = gained, lost
        return {"nfr": lost / self.n, "pfr": gained / self.n, "churn": self.differ / self.n}
