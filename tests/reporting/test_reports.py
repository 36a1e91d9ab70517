"""Terminal and HTML reports of real PairAnalysis objects whose flips are known by hand."""

import io
import re
from html.parser import HTMLParser

import numpy as np
import pytest
from rich.console import Console

from flipgate.metrics import compare_logits
from flipgate.metrics.report import PairAnalysis
from flipgate.reporting.html import render_html, report_body, stored_body
from flipgate.reporting.rows import fmt_limit, fmt_pct, verdict_hints
from flipgate.reporting.terminal import render_report

CLASSES = ["cat", "dog", "bird"]
# Samples 1 and 2 (class cat) are negative flips, 5-8 positive flips, 9 wrong under both.
LABELS = np.array([0, 0, 0, 0, 1, 1, 2, 2, 2, 2])
OLD_PRED = np.array([0, 0, 0, 0, 1, 2, 0, 1, 0, 1])
NEW_PRED = np.array([0, 1, 2, 0, 1, 1, 2, 2, 2, 0])


def logits(pred: np.ndarray, scale: float | np.ndarray = 2.0) -> np.ndarray:
    """Logits whose argmax is `pred`, with a small class-dependent offset."""
    return np.eye(3)[pred] * scale + np.array([0.0, 0.1, 0.2])


def render_text(report: dict, **names: str) -> str:
    console = Console(record=True, width=120, file=io.StringIO())
    render_report(report, console, **names)
    return console.export_text()


def squash(text: str) -> str:
    return " ".join(text.split())


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(page: str) -> Page:
    parser = Page()
    parser.feed(page)
    parser.close()
    return parser


@pytest.fixture
def analysis() -> PairAnalysis:
    return PairAnalysis(logits(OLD_PRED), logits(NEW_PRED, np.linspace(1, 3, 10)[:, None]), LABELS)


@pytest.fixture
def perfect() -> PairAnalysis:
    """Both models right everywhere; class 2 has no samples, so many rates are undefined."""
    labels = np.array([0, 0, 1, 1])
    return PairAnalysis(logits(labels), logits(labels), labels)


def test_terminal_shows_hand_computed_numbers(analysis: PairAnalysis) -> None:
    text = render_text(analysis.to_dict(), old_name="v1", new_name="v2", class_names=CLASSES)
    assert re.search(r"Negative flips\s*│\s*2 │", text)
    assert re.search(r"Positive flips\s*│\s*4 │", text)
    assert "20.00% (95% CI 5.67% – 50.98%)" in text
    assert "50.00% → 30.00% (-20.00 pts)" in text
    assert re.search(r"Rel-NFR\s*│\s*1\.333 │", text)
    assert "70.00% (old-correct 40.00%, old-incorrect 100.00%)" in text
    assert re.search(r"McNemar p \(one-sided\)\s*│\s*0\.8906 │", text)
    assert re.search(r"cat\s+◀ worst NFR\s*│ 4 │\s+0\.00% │\s+50\.00% │\s+50\.00% │", text)
    assert "dog  ◀" not in text and "bird  ◀" not in text


def test_terminal_hints(analysis: PairAnalysis) -> None:
    text = squash(render_text(analysis.to_dict(), old_name="v1", new_name="v2",
                              class_names=CLASSES))
    assert "v2 fixes 4 samples that v1 got wrong and breaks 2 samples that it got right" in text
    assert "does not make significantly more new errors than it fixes" in text
    assert "p = 0.8906" in text
    assert "NFR may be as high as 50.98%" in text
    assert "Class cat loses the most: NFR 50.00% (2 of 4 samples" in text
    assert "Accuracy improves (error 50.00% → 30.00%) but 2 samples that v1 got right" in text


def test_significant_regression_hint() -> None:
    labels = np.zeros(10, dtype=int)
    report = PairAnalysis(logits(labels), logits(np.ones(10, dtype=int)), labels).to_dict()
    hints = verdict_hints(report, old_name="a", new_name="b")
    assert any("b makes significantly more new errors" in h and "0.0010" in h for h in hints)
    assert "Accuracy gets worse (error 0.00% → 100.00%)." in hints


def test_terminal_without_flips_and_undefined_values(perfect: PairAnalysis) -> None:
    report = perfect.to_dict()
    assert report["rel_nfr"] is None and report["per_class"][2]["er_old"] is None
    text = render_text(report, old_name="a", new_name="b")
    assert re.search(r"Rel-NFR\s*│\s*— │", text)
    assert re.search(r"NFI \(neg\. flips / new errors\)\s*│\s*— │", text)
    assert re.search(r"│ 2\s+│ 0 │\s+— │\s+— │\s+— │\s+— │\s+0 │\s+0 │", text)
    assert "worst" not in text
    squashed = squash(text)
    assert "McNemar's test has nothing to weigh" in squashed
    assert "Accuracy is unchanged (error 0.00% → 0.00%)." in squashed


def test_terminal_does_not_interpret_markup_in_names(analysis: PairAnalysis) -> None:
    text = render_text(analysis.to_dict(), old_name="[bold]v1", new_name="v2[/]",
                       class_names=["[red]cat", "dog", "bird"])
    assert "[bold]v1 → v2[/]" in text
    assert "[red]cat" in text


def test_html_is_self_contained_and_escaped(analysis: PairAnalysis) -> None:
    page = render_html(analysis.values, analysis.to_dict(), old_name="<script>alert(1)</script>",
                       new_name="v2 & co", title="A <b> title", class_names=CLASSES)
    parsed = parse(page)
    assert parsed.tags.count("svg") == 4
    assert "script" not in parsed.tags
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "v2 &amp; co" in page and "A &lt;b&gt; title" in page
    without_namespaces = re.sub(r'xmlns(:\w+)?="[^"]*"', "", page)
    assert "http://" not in without_namespaces and "https://" not in without_namespaces
    assert "<link" not in page and "@import" not in page and "src=" not in page


def test_the_report_body_is_found_again_in_the_page(analysis: PairAnalysis) -> None:
    body = report_body(analysis.values, analysis.to_dict(), old_name="v1", new_name="v2")
    page = render_html(analysis.values, analysis.to_dict(), old_name="v1", new_name="v2")
    assert stored_body(page) == body and "<h2>Headline</h2>" in body
    assert stored_body("<html><body><h2>Headline</h2></body></html>") is None


def test_html_shows_the_numbers(analysis: PairAnalysis) -> None:
    page = render_html(analysis.values, analysis.to_dict(), old_name="v1", new_name="v2",
                       class_names=CLASSES)
    text = squash(" ".join(parse(page).text))
    assert "Negative flips 2" in text and "Positive flips 4" in text
    assert "20.00% (95% CI 5.67% – 50.98%)" in text
    assert "McNemar p (one-sided) 0.8906" in text
    assert "Class cat loses the most" in text
    assert '<tr class="worst"><td>cat</td>' in page
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids))


def test_html_without_flips_and_undefined_values(perfect: PairAnalysis) -> None:
    page = render_html(perfect.values, perfect.to_dict(), old_name="a", new_name="b")
    parsed = parse(page)
    assert parsed.tags.count("svg") == 4
    assert "<td>—</td>" in page
    assert 'class="worst"' not in page


def test_html_shows_the_per_group_table_when_the_eval_set_has_groups() -> None:
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 3, 90)
    old = np.eye(3)[labels] * 3 + rng.normal(size=(90, 3))
    new = old + rng.normal(size=(90, 3)) * 2
    groups = np.array(["thin", "thick", "faint"])[np.arange(90) % 3]
    report = compare_logits(old, new, labels, groups=groups)
    body = report_body(None, report, old_name="v1", new_name="v2")
    table = body[body.index("<h2>Per group</h2>"):]
    rows = re.findall(r"<tr><td>(\w+)</td><td>(\d+)</td>(?:<td>[^<]*</td>){5}<td>(\d+)</td>",
                      table)
    right_then_wrong = (old.argmax(1) == labels) & (new.argmax(1) != labels)
    expected = {(name, str((groups == name).sum()),
                 str((right_then_wrong & (groups == name)).sum())) for name in set(groups)}
    assert set(rows) == expected
    assert "Per group" not in report_body(None, compare_logits(old, new, labels),
                                          old_name="v1", new_name="v2")


def test_a_rate_next_to_its_limit_never_reads_as_the_limit() -> None:
    """A limit keeps the digits it was set with; the measured rate two decimals, or more where
    two would round it onto the limit (a gate reason saying '3.00% is above the maximum 3%')."""
    assert [fmt_limit(limit) for limit in (0.03, 0.0125, 0.07, 0.00125, 0.0)] == [
        "3%", "1.25%", "7%", "0.125%", "0%"]
    assert fmt_pct(0.2027, beside=0.03) == "20.27%" == fmt_pct(0.2027)
    assert fmt_pct(0.030004, beside=0.03) == "3.0004%" and fmt_pct(0.030004) == "3.00%"
    assert fmt_pct(0.02999, beside=0.03) == "2.999%"
