"""fidelity.png: a metric that does not apply to a side (no call of that kind) is marked "n/a", not drawn as 0."""

import math

from mirrorapi.evaluation.fidelity.report import METRIC_TITLES, figure


def test_not_applicable_is_labelled_and_has_no_bar():
    # schema conformance: no successful call with a schema among those scored for this source (None).
    source = {
        "n": 2,
        "simulated": {"bleu4": 12.0, "rouge_l": 30.0, "schema_conformance": None},
        "baseline": {"bleu4": 40.0, "rouge_l": 0.0, "schema_conformance": None},
    }
    overall = {
        "n": 5,
        "simulated": {"bleu4": 10.0, "rouge_l": 25.0, "schema_conformance": 50.0},
        "baseline": {"bleu4": 35.0, "rouge_l": 20.0, "schema_conformance": 75.0},
    }
    fig = figure({"overall": overall, "per_source": {"tau-bench": source}, "baseline": True})
    overall_ax, source_ax = fig.axes[:2]
    labels = [t.get_text() for t in source_ax.get_xticklabels()]
    assert labels == [METRIC_TITLES[k] for k in ("bleu4", "rouge_l", "schema_conformance")]
    heights = [bar.get_height() for bar in source_ax.patches]  # simulator bars, then baseline bars
    assert heights[:2] == [12.0, 30.0] and math.isnan(heights[2])
    assert heights[3:5] == [40.0, 0.0] and math.isnan(heights[5])  # a measured 0 stays a (zero) bar
    marked = [t for t in source_ax.texts if t.get_text() == "n/a"]
    assert len(marked) == 2 and all(abs(t.get_position()[0] - 2) < 0.5 for t in marked)
    assert [t.get_text() for t in overall_ax.texts] == []
