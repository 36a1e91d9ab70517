"""Churn per group of a multi-label traffic report (flipgate.metrics.multilabel_traffic)
against plain numpy on the decisions: unlabelled, and once every sample is labelled, with
the multi-label report's per-group table as on an eval set."""

import numpy as np

from flipgate.metrics.multilabel_traffic import multilabel_traffic_report
from flipgate.metrics.traffic import disagreement_order
from tests.multilabel_reference import (
    assert_group_churn_matches,
    assert_groups_match,
    group_churn_reference,
    group_reference,
)

N, L = 300, 6
NAMES = [f"tag-{j}" for j in range(L)]


def test_churn_per_group_is_numpys_and_labels_add_the_labelled_table():
    rng = np.random.default_rng(3)
    groups = rng.choice(np.array(["cam-a", "cam-b", "cam-c"]), N)
    old = rng.random((N, L))
    new = np.clip(old + rng.normal(0, 0.1, old.shape), 0, 1)
    new[groups == "cam-c", 4] = 1 - new[groups == "cam-c", 4]  # tag-4 turned over on c
    truth = rng.random((N, L)) < 0.3
    decisions = (old > 0.5, new > 0.5)
    order = disagreement_order(*decisions, "0" * 64)

    def report(labels=None):
        return multilabel_traffic_report(old, new, order=order, label_names=NAMES,
                                         labels=labels, groups=groups)

    unlabelled = report()
    assert_group_churn_matches(unlabelled, group_churn_reference(*decisions, groups, NAMES))
    assert unlabelled["per_group_churn"][2]["most_changed_labels"][0]["name"] == "tag-4"
    assert "per_group" not in unlabelled
    labelled = report(truth.astype(np.int64))
    assert_group_churn_matches(labelled, group_churn_reference(*decisions, groups, NAMES))
    assert_groups_match(labelled, group_reference(truth, *decisions, groups))
    assert multilabel_traffic_report(old, new, order=order)["per_group_churn"] is None
