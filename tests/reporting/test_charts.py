"""The HTML report's four SVG plots (flipgate.reporting.charts), read back as XML: what each
draws is checked against the counts, flips and densities computed here from the logits."""

import math
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from flipgate.metrics.report import PairAnalysis
from flipgate.reporting.charts import Axis
from flipgate.reporting.html import MAX_PLOT_CLASSES, render_html

ODD = '<&"$ odd'
CLASSES = [f"class {i}" for i in range(9)] + [ODD]
PLOTS = ("overlap", "class-flips", "displacement", "confidence")
SMALLEST_CHAR = 0.5  # of the font size: narrower than any sans-serif font's average letter


def logit_pair(n: int, classes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    old = np.eye(classes)[labels] * 2.0 + rng.normal(size=(n, classes))
    new = old + rng.normal(size=(n, classes))
    return old, new, labels


def plots(page: str) -> dict[str, ET.Element]:
    """The page's <svg> elements parsed as XML, by their chart class."""
    trees = [ET.fromstring(svg) for svg in re.findall(r"<svg\b.*?</svg>", page, re.S)]
    return {tree.get("class").split()[1]: tree for tree in trees}


def softmax_gap(logits: np.ndarray) -> np.ndarray:
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    top = np.sort(p, axis=1)
    return top[:, -1] - top[:, -2]


@pytest.fixture(scope="module")
def pair() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return logit_pair(3000, len(CLASSES))


@pytest.fixture(scope="module")
def drawn(pair) -> dict[str, ET.Element]:
    old, new, labels = pair
    analysis = PairAnalysis(old, new, labels)
    return plots(render_html(analysis.values, analysis.to_dict(), old_name="<b>v1</b>",
                             new_name="v2 & co", class_names=CLASSES))


def bars(tree: ET.Element, kind: str) -> list[ET.Element]:
    return tree.findall(f".//rect[@class='bar {kind}']")


def attr(element: ET.Element, name: str) -> float:
    return float(element.get(name))


def ticks(tree: ET.Element, axis: str) -> list[float]:
    return [float(t.get("data-value")) for t in tree.iter("text")
            if t.get("class") == f"tick {axis}" and t.get("data-value") is not None]


def per_unit(tree: ET.Element, axis: str) -> float:
    """Length of one unit along an axis, from where its tick labels are drawn (all alike
    offset from their ticks)."""
    at = {float(t.get("data-value")): attr(t, "x" if axis == "x" else "y")
          for t in tree.iter("text") if t.get("class") == f"tick {axis}"}
    top = max(at)
    return abs(at[top] - at[0.0]) / top


def legend_labels(tree: ET.Element) -> list[str]:
    return [t.text for t in tree.iter("text") if t.get("class") == "legend-label"]


def test_every_plot_parses_as_xml_and_loads_nothing(drawn) -> None:
    assert sorted(drawn) == sorted(PLOTS)
    for tree in drawn.values():
        names = {element.tag for element in tree.iter()}
        assert names <= {"svg", "g", "rect", "line", "path", "text", "title"}
        assert not any("href" in name or "http" in value or "url(" in value
                       for element in tree.iter() for name, value in element.attrib.items())


def test_overlap_bars_are_as_long_as_the_counts(pair, drawn) -> None:
    old, new, labels = pair
    old_right, new_right = old.argmax(1) == labels, new.argmax(1) == labels
    progress, regress = np.sum(~old_right & new_right), np.sum(old_right & ~new_right)
    common = np.sum(~old_right & ~new_right)
    tree = drawn["overlap"]
    (shown_progress,), (regress_bar,) = bars(tree, "progress"), bars(tree, "regress")
    old_common, new_common = bars(tree, "common")
    assert [int(b.get("data-value")) for b in (shown_progress, old_common, regress_bar)] == [
        progress, common, regress]
    per_sample = per_unit(tree, "x")
    for bar, count in ((shown_progress, progress), (new_common, common),
                       (regress_bar, regress)):
        assert attr(bar, "width") == pytest.approx(count * per_sample, abs=0.02)
    # progress | common on the old model's row; common | regress on the new one's, offset
    assert attr(old_common, "x") == pytest.approx(attr(shown_progress, "x")
                                                  + attr(shown_progress, "width"), abs=0.02)
    assert attr(new_common, "x") == pytest.approx(attr(old_common, "x"))
    assert attr(regress_bar, "x") == pytest.approx(attr(new_common, "x")
                                                   + attr(new_common, "width"), abs=0.02)
    legend = legend_labels(tree)
    assert legend == [f"progress {progress}", f"common {common}", f"regress {regress}"]
    assert min(ticks(tree, "x")) == 0 and max(ticks(tree, "x")) >= progress + common + regress


def test_class_bars_are_as_tall_as_each_classs_flips(pair, drawn) -> None:
    old, new, labels = pair
    old_right, new_right = old.argmax(1) == labels, new.argmax(1) == labels
    expected = {
        "negative": np.bincount(labels[old_right & ~new_right], minlength=len(CLASSES)),
        "positive": np.bincount(labels[~old_right & new_right], minlength=len(CLASSES)),
    }
    tree = drawn["class-flips"]
    groups = tree.findall(".//g[@class='group']")
    assert [group.get("data-group") for group in groups] == CLASSES
    heights = {kind: [attr(group.find(f"rect[@class='bar {kind}']"), "height")
                      for group in groups] for kind in expected}
    values = {kind: [int(group.find(f"rect[@class='bar {kind}']").get("data-value"))
                     for group in groups] for kind in expected}
    per_sample = per_unit(tree, "y")
    for kind, counts in expected.items():
        assert values[kind] == counts.tolist()
        assert heights[kind] == pytest.approx(counts * per_sample, abs=0.02)
    assert min(ticks(tree, "y")) == 0 and max(ticks(tree, "y")) >= expected["negative"].max()
    assert all(tick == int(tick) for tick in ticks(tree, "y"))


def densities(tree: ET.Element) -> dict[str, list[ET.Element]]:
    paths = tree.findall(".//path")
    return {kind: [p for p in paths if p.get("class") == f"density {kind}"]
            for kind in ("kept", "all", "negative")}


def numbers(element: ET.Element, name: str) -> np.ndarray:
    return np.array([float(value) for value in element.get(name).split()])


def check_density(panel: ET.Element, path: ET.Element, values: np.ndarray,
                  edges: np.ndarray) -> None:
    """The path's bins are numpy's density histogram of `values` on `edges` (area 1), and
    its outline's heights above the baseline are those on the panel's y axis."""
    heights, _ = np.histogram(values, bins=edges, density=True)
    assert numbers(path, "data-edges") == pytest.approx(edges)
    assert numbers(path, "data-heights") == pytest.approx(heights)
    assert np.sum(heights * np.diff(edges)) == pytest.approx(1.0)
    assert int(path.get("data-n")) == values.size
    points = np.array([[float(v) for v in point.split(",")]
                       for point in re.findall(r"-?[\d.]+,-?[\d.]+", path.get("d"))])
    baseline, tops = points[0, 1], points[1:-1:2, 1]  # one top per bin, at its left edge
    assert baseline - tops == pytest.approx(heights * per_unit(panel, "y"), abs=0.02)


def test_displacement_densities_are_numpys_histograms(pair, drawn) -> None:
    old, new, _ = pair
    displacement = np.linalg.norm(new - old, axis=1)
    kept = old.argmax(1) == new.argmax(1)
    negative = (old.argmax(1) == pair[2]) & (new.argmax(1) != pair[2])
    tree = drawn["displacement"]
    paths = densities(tree)
    pooled = np.concatenate([displacement[kept], displacement[negative]])
    edges = np.histogram_bin_edges(pooled, bins=int(np.clip(np.sqrt(pooled.size), 5, 30)))
    check_density(tree, paths["kept"][0], displacement[kept], edges)
    check_density(tree, paths["negative"][0], displacement[negative], edges)
    assert min(ticks(tree, "x")) <= edges[0] and max(ticks(tree, "x")) >= edges[-1]
    legend = legend_labels(tree)
    assert legend == [f"kept (n={kept.sum()})", f"negative flips (n={negative.sum()})"]


def test_confidence_gap_densities_per_model(pair, drawn) -> None:
    old, new, labels = pair
    negative = (old.argmax(1) == labels) & (new.argmax(1) != labels)
    tree = drawn["confidence"]
    panels = tree.findall("g[@class='panel']")
    edges = np.linspace(0, 1, 21)
    for panel, logits, title in zip(panels, (old, new), ("under <b>v1</b> (old)",
                                                         "under v2 & co (new)"), strict=True):
        paths = densities(panel)
        gap = softmax_gap(logits)
        check_density(panel, paths["all"][0], gap, edges)
        check_density(panel, paths["negative"][0], gap[negative], edges)
        assert panel.find("text[@class='panel-title']").text == title
        top = max(numbers(path, "data-heights").max() for path in panel.iter("path"))
        assert max(ticks(panel, "y")) >= top and ticks(panel, "x")[::5] == [0.0, 1.0]


def inside(tree: ET.Element) -> list[str]:
    """What lies outside the viewBox: shapes by their coordinates, text by its anchor and
    a lower bound of its length (turned by its rotation)."""
    _, _, width, height = (float(v) for v in tree.get("viewBox").split())
    outside = []

    def check(element: ET.Element, points: list[tuple[float, float]]) -> None:
        if any(not (-0.01 <= x <= width + 0.01 and -0.01 <= y <= height + 0.01)
               for x, y in points):
            outside.append(ET.tostring(element, encoding="unicode")[:120])

    for element in tree.iter():
        if element.tag == "rect":
            x, y, w, h = (attr(element, name) for name in ("x", "y", "width", "height"))
            check(element, [(x, y), (x + w, y + h)])
        elif element.tag == "line":
            check(element, [(attr(element, "x1"), attr(element, "y1")),
                            (attr(element, "x2"), attr(element, "y2"))])
        elif element.tag == "path":
            check(element, [tuple(float(v) for v in point.split(",")) for point in
                            re.findall(r"-?[\d.]+,-?[\d.]+", element.get("d"))])
        elif element.tag == "text":
            check(element, text_ends(element, float(tree.get("font-size"))))
    return outside


def text_ends(element: ET.Element, font_size: float) -> list[tuple[float, float]]:
    x, y = attr(element, "x"), attr(element, "y")
    shown = "".join(element.itertext()) if element.find("title") is None else (
        element.find("title").tail or "")
    length = len(shown) * SMALLEST_CHAR * float(element.get("font-size", font_size))
    start = {"start": 0.0, "middle": -length / 2, "end": -length}[element.get("text-anchor")]
    turn = re.match(r"rotate\((-?[\d.]+)", element.get("transform", ""))
    angle = math.radians(float(turn.group(1))) if turn else 0.0
    return [(x + offset * math.cos(angle), y + offset * math.sin(angle))
            for offset in (start, start + length)]


def test_everything_is_drawn_inside_the_viewbox(drawn) -> None:
    for name, tree in drawn.items():
        assert inside(tree) == [], name


def test_names_render_literally(drawn) -> None:
    shown = {text for tree in drawn.values() for element in tree.iter("text")
             for text in [element.text or "", "".join(element.itertext())]}
    assert ODD in shown and "<b>v1</b> wrong" in shown and "v2 & co wrong" in shown


def test_crowded_classes_are_turned_and_many_are_cut_to_the_busiest() -> None:
    old, new, labels = logit_pair(4000, 40, seed=1)
    analysis = PairAnalysis(old, new, labels)
    names = [f"a rather long class name {i}" for i in range(40)]
    page = render_html(analysis.values, analysis.to_dict(), old_name="a", new_name="b",
                       class_names=names)
    tree = plots(page)["class-flips"]
    groups = tree.findall(".//g[@class='group']")
    flips = np.bincount(labels[(old.argmax(1) == labels) != (new.argmax(1) == labels)],
                        minlength=40)
    busiest = np.sort(np.argsort(-flips, kind="stable")[:MAX_PLOT_CLASSES])
    assert [group.get("data-group") for group in groups] == [names[i] for i in busiest]
    assert all("rotate(-45" in group.find("text").get("transform") for group in groups)
    assert f"({MAX_PLOT_CLASSES} classes with the most flips)" in page
    assert inside(tree) == []
    few = PairAnalysis(old[:, :5], new[:, :5], labels % 5)
    level = plots(render_html(few.values, few.to_dict(), old_name="a", new_name="b"))
    assert not any(text.get("transform") for text in level["class-flips"].iter("text")
                   if text.get("class") == "tick x")


def test_notes_when_there_is_nothing_to_draw() -> None:
    labels = np.zeros(6, dtype=int)
    everyone_right = PairAnalysis(np.eye(3)[labels] * 2, np.eye(3)[labels] * 2, labels)
    drawn = plots(render_html(everyone_right.values, everyone_right.to_dict(), old_name="a",
                              new_name="b"))
    assert drawn["overlap"].find(".//text[@class='note']").text == "no errors under either model"
    # wrong under both, each a different class: no sample kept, none flipped negatively
    always_changed = PairAnalysis(np.eye(3)[labels + 1] * 2, np.eye(3)[labels + 2] * 2, labels)
    drawn = plots(render_html(always_changed.values, always_changed.to_dict(), old_name="a",
                              new_name="b"))
    assert drawn["displacement"].find(".//text[@class='note']").text == "no samples"
    assert not drawn["displacement"].findall(".//path")
    for tree in drawn.values():
        assert inside(tree) == []


@pytest.mark.parametrize("scale", [1e38, 1e-38])
def test_charts_draw_for_huge_and_tiny_finite_logits(scale) -> None:
    """Logits near float32's limits: densities of ~1e-39 and displacements of ~1e38 still
    get an axis of distinct ticks, and every coordinate is a finite number in the viewBox."""
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 3, 400)
    old, new = (rng.choice([-scale, scale], (400, 3)).astype(np.float32) for _ in range(2))
    analysis = PairAnalysis(old, new, labels)
    drawn = plots(render_html(analysis.values, analysis.to_dict(), old_name="a", new_name="b"))
    assert sorted(drawn) == sorted(PLOTS)
    for name, tree in drawn.items():
        assert inside(tree) == [], name
        numbers = [float(n) for element in tree.iter() for key in ("x", "y", "x1", "y1", "d")
                   for n in re.findall(r"-?[\d.]+(?:e[-+]?\d+)?", element.get(key, ""))]
        assert numbers and all(math.isfinite(n) for n in numbers), name
        for panel in tree.findall(".//g[@class='panel']") or [tree]:
            shown = [t.text for t in panel.iter("text") if t.get("class") == "tick y"]
            assert len(set(shown)) == len(shown), name


@pytest.mark.parametrize(("low", "high", "integer"), [
    (0, 1, False), (0, 3249, True), (0, 0.75, False), (0, 0, True), (0, 3, True),
    (-0.5, 0.5, False), (3.1, 7.9, False), (0.013, 0.0171, False), (0, 2.3e6, True),
    (0, 1.3e-39, False), (-2e38, 3.4e38, False), (1e9, 1e9 + 7, False)])
def test_axis_ticks_are_nice_steps_covering_the_data(low, high, integer) -> None:
    axis = Axis.covering(low, high, integer=integer)
    steps = np.diff(axis.ticks)
    assert axis.ticks[0] <= low and axis.ticks[-1] >= high and 2 <= len(axis.ticks) <= 10
    assert steps == pytest.approx(np.full(steps.size, axis.step))
    mantissa = axis.step / 10 ** math.floor(math.log10(axis.step))
    assert round(mantissa, 6) in (1, 2, 5)
    if integer:
        assert all(tick == int(tick) for tick in axis.ticks)
    labels = [axis.label(tick) for tick in axis.ticks]
    assert len(set(labels)) == len(labels)
