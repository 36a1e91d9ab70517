"""Flip counts and rates: a case computed by hand, and the identities of docs/metrics.md."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flipgate.metrics import count_flips, flipped_indices, per_class

# Hand case: 10 samples, 3 classes.
LABELS = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
OLD = np.array([0, 1, 2, 0, 0, 0, 1, 1, 2, 2])  # wrong at 4, 5, 6, 9
NEW = np.array([0, 1, 1, 1, 1, 2, 2, 1, 2, 2])  # wrong at 2, 3, 6, 9


def test_rates_match_hand_computation():
    rates = count_flips(OLD, NEW, LABELS).rates()
    expected = {
        "er_old": 0.4, "er_new": 0.4,
        "nfr": 0.2,  # samples 2 and 3: old right, new wrong
        "pfr": 0.2,  # samples 4 and 5: old wrong, new right
        "rel_nfr": 0.2 / (0.6 * 0.4),
        "nfi": 2 / 4,  # 2 negative flips among 4 new errors
        "btc": 4 / 6,  # samples 0, 1, 7, 8 right for both, of 6 old-right
        "bec": 2 / 4,  # samples 6 and 9 wrong for both, of 4 new errors
        "churn": 5 / 10,  # predictions differ at 2, 3, 4, 5, 6
        "churn_old_correct": 2 / 6,
        "churn_old_incorrect": 3 / 4,  # 4, 5 fixed and 6 changed its wrong answer
    }
    assert rates == pytest.approx(expected, rel=1e-12)


def test_flipped_indices_and_per_class_match_hand_computation():
    flipped = flipped_indices(OLD, NEW, LABELS)
    assert flipped["negative"].tolist() == [2, 3]
    assert flipped["positive"].tolist() == [4, 5]
    table = per_class(OLD, NEW, LABELS, 3)
    assert [row["n"] for row in table] == [4, 3, 3]
    assert table[0] == pytest.approx({"class": 0, "n": 4, "er_old": 0.5, "er_new": 0.75,
                                      "nfr": 0.25, "pfr": 0.0, "negative_flips": 1,
                                      "positive_flips": 0})
    assert table[1]["pfr"] == pytest.approx(1 / 3) and table[1]["er_new"] == 0
    assert (table[2]["negative_flips"], table[2]["positive_flips"]) == (1, 1)


def test_undefined_ratios_are_none():
    labels = np.array([0, 1])
    rates = count_flips(labels, labels, labels).rates()  # both models perfect
    assert rates["rel_nfr"] is None and rates["nfi"] is None and rates["bec"] is None
    assert rates["churn_old_incorrect"] is None
    assert rates["nfr"] == 0 and rates["btc"] == 1
    per_class_rows = per_class(labels, labels, labels, 3)
    assert per_class_rows[2]["n"] == 0 and per_class_rows[2]["nfr"] is None


@st.composite
def prediction_triples(draw):
    n = draw(st.integers(1, 60))
    classes = draw(st.integers(2, 5))
    column = st.lists(st.integers(0, classes - 1), min_size=n, max_size=n)
    return tuple(np.array(draw(column)) for _ in range(3))


@given(prediction_triples())
def test_identities_hold_exactly(triple):
    old, new, labels = triple
    c = count_flips(old, new, labels)
    n = c.n
    er_old, er_new = Fraction(c.old_wrong, n), Fraction(c.new_wrong, n)
    nfr, pfr = Fraction(c.negative_flips, n), Fraction(c.positive_flips, n)
    churn = Fraction(c.changed, n)
    assert er_new - er_old == nfr - pfr
    assert nfr <= min(er_new, 1 - er_old)
    assert churn <= er_old + er_new
    if c.old_right:
        assert Fraction(c.both_right, c.old_right) == 1 - nfr / (1 - er_old)
    assert c.changed == int(np.count_nonzero(old != new))
    rates = c.rates()
    assert rates["er_new"] - rates["er_old"] == pytest.approx(rates["nfr"] - rates["pfr"],
                                                              abs=1e-15)
