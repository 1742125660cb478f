"""The workflow DAG's layout and drawing: longest-path layers, a barycenter order that
undoes crossings, wide layers folded into a counted box, well-formed SVG with every
name escaped."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET

from cronwheel.ui.dag import BOX_H, BOX_W, Layout, NodeLook, dag_svg, layered, layers_of

SVG = "{http://www.w3.org/2000/svg}"


def _crossings(layout: Layout) -> int:
    """Pairs of edges between the same two adjacent layers that cross."""
    boxes = {b.key: b for b in layout.boxes}
    spans = [
        (boxes[a].layer, boxes[a].y, boxes[b].y)
        for a, b in layout.edges
        if boxes[b].layer == boxes[a].layer + 1
    ]
    return sum(
        1
        for (la, a1, a2), (lb, b1, b2) in itertools.combinations(spans, 2)
        if la == lb and (a1 - b1) * (a2 - b2) < 0
    )


def test_a_node_sits_one_layer_past_its_deepest_upstream_node() -> None:
    nodes = [
        ("extract", []),
        ("clean", ["extract"]),
        ("enrich", ["clean"]),
        ("load", ["extract", "enrich"]),  # a short and a long way in: the long one counts
        ("notify", []),
    ]
    assert layers_of(nodes) == {"extract": 0, "clean": 1, "enrich": 2, "load": 3, "notify": 0}
    layout = layered(nodes)
    xs = {b.key: b.x for b in layout.boxes}
    assert xs["extract"] == xs["notify"] < xs["clean"] < xs["enrich"] < xs["load"]
    # Every edge points right, from the box's right side to the next one's left.
    boxes = {b.key: b for b in layout.boxes}
    assert all(boxes[a].x + BOX_W < boxes[b].x for a, b in layout.edges)
    assert set(layout.edges) == {
        ("extract", "clean"), ("clean", "enrich"), ("extract", "load"), ("enrich", "load"),
    }  # fmt: skip
    assert layout.width >= max(b.x for b in layout.boxes) + BOX_W
    assert layout.height >= max(b.y for b in layout.boxes) + BOX_H


def test_the_barycenter_pass_undoes_crossings_of_the_definition_order() -> None:
    # Defined so that each child comes in the opposite order from its parent.
    nodes = [
        ("a", []), ("b", []), ("c", []),
        ("from_c", ["c"]), ("from_b", ["b"]), ("from_a", ["a"]),
        ("end_a", ["from_a"]), ("end_c", ["from_c"]), ("end_b", ["from_b"]),
    ]  # fmt: skip
    layout = layered(nodes)
    assert _crossings(layout) == 0
    ys = {b.key: b.y for b in layout.boxes}
    assert ys["a"] == ys["from_a"] == ys["end_a"]
    columns = [[b.key for b in layout.boxes if b.layer == i] for i in range(3)]
    assert columns == [["a", "b", "c"], ["from_a", "from_b", "from_c"], ["end_a", "end_b", "end_c"]]


def test_a_diamond_keeps_its_columns_centred() -> None:
    nodes = [("start", []), ("left", ["start"]), ("right", ["start"]), ("join", ["left", "right"])]
    layout = layered(nodes)
    ys = {b.key: b.y for b in layout.boxes}
    assert ys["start"] == ys["join"] == (ys["left"] + ys["right"]) / 2
    assert _crossings(layout) == 0


def test_a_wide_fan_out_folds_into_a_counted_box() -> None:
    fan = [f"shard-{i:04d}" for i in range(1000)]
    nodes = [("split", []), *((name, ["split"]) for name in fan), ("merge", fan)]
    failed = {"shard-0500", "shard-0999"}
    layout = layered(nodes, max_per_layer=12, rank=lambda n: 0 if n in failed else 1)
    middle = [b for b in layout.boxes if b.layer == 1]
    assert len(middle) == 12
    fold = middle[-1]
    assert fold.folded and len(fold.names) == 1000 - 11
    shown = [b.key for b in middle[:-1]]
    assert failed <= set(shown)  # what ranks first is drawn one by one
    assert sorted(shown + list(fold.names)) == fan  # every node drawn exactly once
    assert layout.box_of("shard-0001").key in {*shown, fold.key}
    # One edge per pair of boxes: split -> each box of the layer -> merge.
    assert len(layout.edges) == 2 * 12
    looks = {name: NodeLook(state="SUCCESS", detail="done") for name in fan}
    looks["shard-0500"] = NodeLook(state="FAILED", detail="boom")
    markup = dag_svg(layout, looks, label="a fan-out")
    assert len(markup) < 20_000  # the page stays small
    svg = ET.fromstring(markup)
    fold_g = next(g for g in svg.iter(f"{SVG}g") if "fold" in (g.get("class") or ""))
    texts = "".join(t.text or "" for t in fold_g.iter(f"{SVG}text"))
    assert "989 more nodes" in texts and "SUCCESS" in texts


def test_the_drawing_colours_links_and_escapes_each_node() -> None:
    nodes = [("fetch", []), ("parse<x>", ["fetch"]), ("store", ["parse<x>"])]
    looks = {
        "fetch": NodeLook(state="SUCCESS", detail="1/3", href="/ui/runs/1", tip="done"),
        "parse<x>": NodeLook(state="FAILED", detail='bad "input"', href="/ui/runs/2?a=1&b=2"),
        "store": NodeLook(state="PENDING", detail="waiting"),
    }
    svg = ET.fromstring(dag_svg(layered(nodes), looks, label="run <1>"))
    assert svg.get("aria-label") == "run <1>"
    groups = {g.get("data-node"): g for g in svg.iter(f"{SVG}g") if g.get("data-node")}
    assert {k: g.get("class") for k, g in groups.items()} == {
        "fetch": "node s-SUCCESS",
        "parse<x>": "node s-FAILED",
        "store": "node s-PENDING",
    }
    links = [a.get("href") for a in svg.iter(f"{SVG}a")]
    assert links == ["/ui/runs/1", "/ui/runs/2?a=1&b=2"]  # the pending node has no run page
    assert len(svg.findall(f"{SVG}path")) == 2  # the two edges (the arrow is in defs)
    titles = [t.text for t in svg.iter(f"{SVG}title")]
    assert "fetch — done" in titles


def test_long_names_are_shortened_and_a_cycle_does_not_hang() -> None:
    long = "a" * 100
    layout = layered([(long, []), ("x", ["y", "missing"]), ("y", ["x"])])
    assert layers_of([(long, []), ("x", ["y"]), ("y", ["x"])])["x"] == 1
    svg = ET.fromstring(dag_svg(layout, {}, label="g"))
    names = [t.text or "" for t in svg.iter(f"{SVG}text") if t.get("class") == "name"]
    assert all(len(n) <= 24 for n in names) and any(n.endswith("…") for n in names)
    empty = ET.fromstring(dag_svg(layered([]), {}, label="empty"))
    assert not list(empty.iter(f"{SVG}g")) and not list(empty.iter(f"{SVG}text"))


def test_a_long_chain_keeps_its_ends_and_folds_its_middle() -> None:
    chain = [(f"step-{i}", [f"step-{i - 1}"] if i else []) for i in range(2000)]
    # Side branches leave its start and join its end: the fold is the straight part.
    nodes = [*chain, ("audit", ["step-0"]), ("report", ["step-1999", "audit"])]
    layout = layered(nodes, max_per_chain=12)
    [fold] = [b for b in layout.boxes if b.folded]
    assert fold.fold == "chain" and fold.names == tuple(f"step-{i}" for i in range(6, 1995))
    drawn = {b.key for b in layout.boxes if not b.folded}
    assert drawn == {f"step-{i}" for i in (*range(6), *range(1995, 2000))} | {"audit", "report"}
    assert ("step-5", fold.key) in layout.edges and (fold.key, "step-1995") in layout.edges
    assert ("step-0", "audit") in layout.edges and ("audit", "report") in layout.edges
    markup = dag_svg(layout, {}, label="a long chain")
    assert len(markup) < 10_000 and "1989 nodes in a row" in markup
    # A short chain is drawn whole.
    assert not any(b.folded for b in layered(chain[:12], max_per_chain=12).boxes)
