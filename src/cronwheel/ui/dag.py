"""A workflow's DAG drawn on the server as inline SVG: a layered layout computed here,
no script, no library.

::

    nodes and their "after" edges
      │ chains: a straight run of more than ``max_per_chain`` nodes keeps its ends
      │         and becomes one box in the middle, so a 2,000-step chain is 11 boxes
      ▼ layer:  longest path from the roots — a node sits one column right of its
      │         deepest upstream node, so every edge points right
      ▼ order:  definition order, then one barycenter sweep down the layers and one
      │         back up (each node moves toward the mean place of its neighbours in
      │         the layers already ordered), which undoes most crossings
      ▼ fold:   a layer of more than ``max_per_layer`` nodes shows the first of them by
      │         rank (the caller's: failed before succeeded) and one box counting
      │         the rest, so a fan-out of 1,000 nodes draws as 12 boxes
      ▼ place:  columns left to right, each centred on the tallest
    SVG:  edges (one per pair of boxes, under them), then the boxes — coloured by the
          stylesheet's state classes (``s-SUCCESS`` …), each a link to its node's run

The layout holds names and coordinates only; how a node looks (its state, a second
line, its link) the caller passes to :func:`dag_svg`.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from html import escape

__all__ = [
    "BOX_H",
    "BOX_W",
    "Box",
    "Layout",
    "NodeLook",
    "dag_svg",
    "layered",
    "layers_of",
]

BOX_W = 172
BOX_H = 40
_GAP_X = 56
_GAP_Y = 12
_MARGIN = 8
_NAME_CHARS = 24  # what fits a box at the stylesheet's font size


@dataclass(frozen=True, slots=True)
class Box:
    """A drawn box: one node, or a fold of many — a wide layer's remaining nodes, or
    the middle of a long straight run."""

    key: str  # the node's name; a fold's starts with "+" (no node name holds one)
    names: tuple[str, ...]  # the nodes it stands for
    layer: int
    x: float
    y: float
    fold: str = ""  # "layer" or "chain" for a fold

    @property
    def folded(self) -> bool:
        return bool(self.fold)


@dataclass(frozen=True, slots=True)
class Layout:
    boxes: tuple[Box, ...]
    edges: tuple[tuple[str, str], ...]  # (box key, box key), each pair once, left to right
    width: float
    height: float

    def box_of(self, name: str) -> Box:
        """The box that draws node ``name`` (its own, or its layer's fold)."""
        for box in self.boxes:
            if name in box.names:
                return box
        raise KeyError(name)


def _graph(
    nodes: Sequence[tuple[str, Sequence[str]]],
) -> tuple[list[str], dict[str, list[str]], dict[str, list[str]]]:
    """Names in definition order, and each node's upstream and downstream nodes (an
    unknown name or a node after itself left out: the API refuses both)."""
    names = list(dict.fromkeys(name for name, _ in nodes))
    known = set(names)
    ups: dict[str, list[str]] = {name: [] for name in names}
    downs: dict[str, list[str]] = {name: [] for name in names}
    for name, after in nodes:
        for up in dict.fromkeys(after):
            if up in known and up != name and up not in ups[name]:
                ups[name].append(up)
                downs[up].append(name)
    return names, ups, downs


def layers_of(nodes: Sequence[tuple[str, Sequence[str]]]) -> dict[str, int]:
    """Each node's layer: 0 for a root, else one more than its deepest upstream node.
    Nodes on a cycle (which the API refuses) go one layer past all the others."""
    names, ups, downs = _graph(nodes)
    waiting = {name: len(ups[name]) for name in names}
    ready = deque(name for name in names if waiting[name] == 0)
    layer: dict[str, int] = {}
    while ready:
        name = ready.popleft()
        layer[name] = max((layer[up] + 1 for up in ups[name]), default=0)
        for down in downs[name]:
            waiting[down] -= 1
            if waiting[down] == 0:
                ready.append(down)
    last = max(layer.values(), default=-1)
    for name in names:
        layer.setdefault(name, last + 1)
    return layer


def _centred(columns: list[list[str]]) -> dict[str, float]:
    """Each node's place in its column, measured from the column's middle (columns
    are drawn centred, so this is the height it is drawn at)."""
    return {name: i - (len(column) - 1) / 2 for column in columns for i, name in enumerate(column)}


def _sweep(
    columns: list[list[str]], neighbours: dict[str, list[str]], indexes: Sequence[int]
) -> None:
    """Sort each column in ``indexes`` by the mean place of each node's neighbours (a
    node without any keeps its own place as its key; the sort is stable)."""
    place = _centred(columns)
    for i in indexes:
        keys = {}
        for name in columns[i]:
            near = neighbours[name]
            keys[name] = sum(place[n] for n in near) / len(near) if near else place[name]
        columns[i].sort(key=keys.__getitem__)
        place.update(_centred([columns[i]]))


def _straight_runs(
    names: list[str], ups: dict[str, list[str]], downs: dict[str, list[str]], longest: int
) -> list[list[str]]:
    """Runs of more than ``longest`` nodes each the only one after the one before it,
    which runs before nothing else: a chain, drawn one box per layer."""

    def next_of(name: str) -> str | None:
        if len(downs[name]) == 1 and len(ups[downs[name][0]]) == 1:
            return downs[name][0]
        return None

    found = []
    for name in names:
        if len(ups[name]) == 1 and next_of(ups[name][0]) == name:
            continue  # inside a run that starts further up
        run, seen = [name], {name}
        while (after := next_of(run[-1])) is not None and after not in seen:
            run.append(after)
            seen.add(after)
        if len(run) > longest:
            found.append(run)
    return found


def _fold_chains(
    nodes: Sequence[tuple[str, Sequence[str]]], longest: int
) -> tuple[list[tuple[str, list[str]]], dict[str, tuple[str, ...]]]:
    """The graph with the middle of each run longer than ``longest`` made one unit (its
    ends kept), and the nodes each unit stands for."""
    names, ups, downs = _graph(nodes)
    keep = max((longest - 1) // 2, 1)
    members: dict[str, tuple[str, ...]] = {name: (name,) for name in names}
    unit_of = {name: name for name in names}
    for run in _straight_runs(names, ups, downs, max(longest, 2 * keep + 1)):
        middle = tuple(run[keep:-keep])
        members[f"+~{middle[0]}"] = middle
        unit_of.update((name, f"+~{middle[0]}") for name in middle)
    units: dict[str, list[str]] = {}
    for name in names:
        unit = unit_of[name]
        if unit not in units:  # a fold stands where its first node was defined
            units[unit] = [unit_of[up] for up in ups[members[unit][0]]]
    return list(units.items()), {unit: members[unit] for unit in units}


def layered(
    nodes: Sequence[tuple[str, Sequence[str]]],
    *,
    max_per_layer: int = 12,
    max_per_chain: int = 12,
    rank: Callable[[str], int] | None = None,
) -> Layout:
    """The drawing's layout for ``nodes`` — (name, names it runs after) in definition
    order. A layer of more than ``max_per_layer`` nodes keeps ``max_per_layer - 1`` of
    them, the lowest ``rank`` first (then in order), and folds the rest into one box; a
    straight run of more than ``max_per_chain`` nodes keeps its ends and folds its
    middle into one box."""
    units, members = _fold_chains(nodes, max_per_chain)
    keys, ups, downs = _graph(units)
    layer = layers_of(units)
    columns: list[list[str]] = [[] for _ in range(max(layer.values(), default=-1) + 1)]
    for key in keys:
        columns[layer[key]].append(key)
    _sweep(columns, ups, range(1, len(columns)))
    _sweep(columns, downs, range(len(columns) - 2, -1, -1))

    def rank_of(key: str) -> int:
        return min(rank(name) for name in members[key]) if rank else 0

    stacks: list[list[tuple[str, list[str]]]] = []  # per layer: (box key, its units)
    for i, column in enumerate(columns):
        if len(column) <= max_per_layer:
            stacks.append([(key, [key]) for key in column])
            continue
        order = {key: n for n, key in enumerate(column)}
        by_rank = sorted(column, key=lambda k: (rank_of(k), order[k]))
        shown = set(by_rank[: max_per_layer - 1])
        rest = [key for key in column if key not in shown]
        stacks.append([(key, [key]) for key in column if key in shown] + [(f"+{i}", rest)])

    tallest = max((len(stack) for stack in stacks), default=0)
    pitch = BOX_H + _GAP_Y
    boxes: list[Box] = []
    box_of: dict[str, str] = {}  # each unit's box
    for i, stack in enumerate(stacks):
        top = _MARGIN + (tallest - len(stack)) * pitch / 2
        x = _MARGIN + i * (BOX_W + _GAP_X)
        for row, (key, inside) in enumerate(stack):
            fold = "chain" if key.startswith("+~") else "layer" if key.startswith("+") else ""
            names = tuple(name for unit in inside for name in members[unit])
            boxes.append(Box(key=key, names=names, layer=i, x=x, y=top + row * pitch, fold=fold))
            box_of.update((unit, key) for unit in inside)
    edges = dict.fromkeys((box_of[up], box_of[key]) for key in keys for up in ups[key])
    layers = len(stacks)
    return Layout(
        boxes=tuple(boxes),
        edges=tuple(edges),
        width=2 * _MARGIN + layers * BOX_W + max(layers - 1, 0) * _GAP_X,
        height=2 * _MARGIN + tallest * pitch - (_GAP_Y if tallest else 0),
    )


@dataclass(frozen=True, slots=True)
class NodeLook:
    """How one node is drawn."""

    state: str | None  # its class is ``s-<state>``; None: drawn plain (a definition)
    detail: str  # the box's second line
    href: str | None = None  # where the box links to
    tip: str = ""  # its tooltip (the full name comes first)


def _short(text: str, limit: int = _NAME_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _fold_detail(states: Counter[str]) -> str:
    shown = [f"{count} {state}" for state, count in states.most_common(2)]
    return " · ".join(shown) + (" …" if len(states) > 2 else "")


def _box(box: Box, looks: Mapping[str, NodeLook]) -> str:
    x, y = box.x, box.y
    if box.folded:
        states = Counter(looks[n].state or "none" for n in box.names if n in looks)
        title = f"{len(box.names)} " + ("nodes in a row" if box.fold == "chain" else "more nodes")
        detail = _fold_detail(states) if states.keys() != {"none"} else "not drawn one by one"
        tip = title + ": " + ", ".join(f"{s} {c}" for s, c in sorted(states.items()))
        parts = [
            f'<g class="node fold"><title>{escape(tip)}</title>'
            f'<rect x="{x:.0f}" y="{y:.0f}" width="{BOX_W}" height="{BOX_H}" rx="6"/>'
        ]
        left = x + 1.0
        total = max(sum(states.values()), 1)
        for state, count in sorted(states.items()):  # the fold's states as a bar
            width = (BOX_W - 2) * count / total
            parts.append(
                f'<rect class="s-{escape(state)}" x="{left:.1f}" y="{y + BOX_H - 6:.0f}" '
                f'width="{width:.1f}" height="5"/>'
            )
            left += width
        parts.append(
            f'<text class="name" x="{x + 9:.0f}" y="{y + 16:.0f}">+ {escape(title)}</text>'
            f'<text class="detail" x="{x + 9:.0f}" y="{y + 29:.0f}">'
            f"{escape(_short(detail, 30))}</text></g>"
        )
        return "".join(parts)
    look = looks.get(box.key, NodeLook(state=None, detail=""))
    state = look.state or "none"
    tip = box.key + (f" — {look.tip}" if look.tip else "")
    inner = (
        f"<title>{escape(tip)}</title>"
        f'<rect x="{x:.0f}" y="{y:.0f}" width="{BOX_W}" height="{BOX_H}" rx="6"/>'
        f'<text class="name" x="{x + 9:.0f}" y="{y + 16:.0f}">{escape(_short(box.key))}</text>'
        f'<text class="detail" x="{x + 9:.0f}" y="{y + 31:.0f}">'
        f"{escape(_short(look.detail, 30))}</text>"
    )
    node = f'<g class="node s-{escape(state)}" data-node="{escape(box.key)}">{inner}</g>'
    if look.href:
        return f'<a href="{escape(look.href)}">{node}</a>'
    return node


def _edge(start: Box, end: Box) -> str:
    x1, y1 = start.x + BOX_W, start.y + BOX_H / 2
    x2, y2 = end.x - 3, end.y + BOX_H / 2
    bend = (x2 - x1) / 2
    return (
        f'<path class="edge" d="M{x1:.0f},{y1:.0f} C{x1 + bend:.0f},{y1:.0f} '
        f'{x2 - bend:.0f},{y2:.0f} {x2:.0f},{y2:.0f}" marker-end="url(#dag-arrow)"/>'
    )


def dag_svg(layout: Layout, looks: Mapping[str, NodeLook], *, label: str) -> str:
    """The layout as SVG markup at its natural size (a wide or deep graph scrolls in
    its box rather than shrinking its text); every text in it escaped here."""
    width, height = max(layout.width, 1), max(layout.height, 1)
    by_key = {box.key: box for box in layout.boxes}
    parts = [
        f'<svg class="dag" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{escape(label)}" '
        'xmlns="http://www.w3.org/2000/svg">'
        '<defs><marker id="dag-arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" '
        'markerHeight="7" orient="auto"><path class="arrow" d="M0,0 L8,4 L0,8 z"/></marker>'
        "</defs>"
    ]
    parts.extend(_edge(by_key[a], by_key[b]) for a, b in layout.edges)
    parts.extend(_box(box, looks) for box in layout.boxes)
    parts.append("</svg>")
    return "".join(parts)
