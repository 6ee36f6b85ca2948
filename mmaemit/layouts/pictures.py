"""Pictures of layouts (PNG, matplotlib), in the manner of CuTe's LaTeX printer: one cell per element or chunk,
labelled with who owns it and coloured so the pattern shows.

* :func:`draw_fragment` - an mma register fragment (:class:`~mmaemit.layouts.FragmentLayout`): cell (row, col) is
  labelled ``T<lane>`` / ``R<reg>[.<elem>]`` (``inverse``), coloured by lane (8 colours, lane % 8).
* :func:`draw_matrix_move` - ldmatrix / stmatrix (:class:`~mmaemit.layouts.MatrixMoveLayout`): the ``num`` 8x8
  matrices side by side, each b16 element labelled with the lane and register half that receives (ldmatrix) or
  supplies (stmatrix) it, each row with the lane that gives its address.
* :func:`draw_swizzle` - a shared-memory swizzle (:class:`~mmaemit.layouts.SwizzleLayout`): a cell per logical 16-byte
  chunk (row, chunk), labelled with the physical chunk it lands in and coloured by its bank group (the 4 banks it
  occupies: ``(address // 16) % 8``). A conflict-free ldmatrix phase is a column of 8 rows with 8 different colours.
* :func:`draw_raster` - a CTA raster order (:class:`~mmaemit.layouts.raster.RasterOrder`): the pid of each tile,
  coloured by wave.

Each returns a :class:`LayoutPicture` with the labels and colour indices it drew (derived from the layout objects
only), so tests and users can check a picture without looking at it. ``mmaemit layout show ...`` is the CLI.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import UnsupportedConfigError
from .fragment import FragmentLayout
from .ldmatrix import MatrixMoveLayout
from .raster import RasterOrder
from .swizzle import CHUNK_BYTES, SwizzleLayout

__all__ = ["LayoutPicture", "draw_fragment", "draw_matrix_move", "draw_swizzle", "draw_raster", "draw_layout",
           "PALETTE"]

#: 8 pastel colours (index = lane % 8, bank group, or wave % 8)
PALETTE = ("#a6cee3", "#b2df8a", "#fb9a99", "#fdbf6f", "#cab2d6", "#ffff99", "#8dd3c7", "#d9d9d9")


@dataclass
class LayoutPicture:
    """What was drawn: ``labels[r, c]`` (str) and ``colors[r, c]`` (index into :data:`PALETTE`) of the grid."""

    path: Path
    kind: str
    title: str
    labels: np.ndarray
    colors: np.ndarray


def _plt():
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("layout pictures need matplotlib: pip install 'mmaemit[plot]' (or pip install matplotlib)") \
            from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _render(path, title, labels, colors, row_names=None, col_names=None, separators=(), fontsize=None,
            footer=None) -> None:
    from matplotlib.patches import Rectangle

    plt = _plt()
    rows, cols = labels.shape
    cell = 0.52
    fig, ax = plt.subplots(figsize=(max(3.0, cols * cell + 1.4), max(2.0, rows * cell * 0.62 + 1.3)))
    fs = fontsize or (6.5 if max(len(s) for s in labels.ravel()) <= 8 else 5.5)
    for r in range(rows):
        for c in range(cols):
            ax.add_patch(Rectangle((c, rows - 1 - r), 1, 1, facecolor=PALETTE[int(colors[r, c]) % len(PALETTE)],
                                   edgecolor="#555555", linewidth=0.4))
            ax.text(c + 0.5, rows - 0.5 - r, labels[r, c], ha="center", va="center", fontsize=fs,
                    family="monospace")
    for c in separators:
        ax.plot([c, c], [0, rows], color="black", linewidth=1.6)
    ax.set_xlim(0, cols)
    ax.set_ylim(0, rows)
    ax.set_xticks(np.arange(cols) + 0.5)
    ax.set_xticklabels(col_names if col_names is not None else [str(c) for c in range(cols)], fontsize=6)
    ax.set_yticks(np.arange(rows) + 0.5)
    ax.set_yticklabels(list(reversed(row_names if row_names is not None else [str(r) for r in range(rows)])),
                       fontsize=6)
    ax.tick_params(length=0)
    ax.xaxis.tick_top()
    for s in ax.spines.values():
        s.set_visible(False)
    width_chars = int(fig.get_figwidth() * 72 / 8 * 1.6)   # characters of an 8-pt title line
    ax.set_title("\n".join(textwrap.fill(line, width_chars) for line in title.split("\n")), fontsize=8, pad=14)
    if footer:
        fig.text(0.01, 0.01, textwrap.fill(footer, int(width_chars * 1.2)), fontsize=6, family="monospace",
                 va="bottom")
    fig.tight_layout(rect=(0, 0.05 if footer else 0, 1, 1))
    _save_small_png(fig, path)
    plt.close(fig)


def _save_small_png(fig, path) -> None:
    """PNG with a 64-colour palette (the cells use 8 colours; text anti-aliasing needs a few more): several times
    smaller than a true-colour PNG, so pictures can live in the repository."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    buf.seek(0)
    img = Image.open(buf).convert("RGB").quantize(colors=64)
    img.save(str(path), optimize=True)


def draw_fragment(layout: FragmentLayout, path, title: str | None = None) -> LayoutPicture:
    """The (lane, register) owning each element of an mma fragment (rows x cols = the operand tile)."""
    labels = np.empty((layout.rows, layout.cols), dtype=object)
    colors = np.zeros((layout.rows, layout.cols), dtype=np.int64)
    for r in range(layout.rows):
        for c in range(layout.cols):
            lane, reg, elem = layout.inverse(r, c)
            labels[r, c] = f"T{lane}\nR{reg}" + (f".{elem}" if layout.elems_per_reg > 1 else "")
            colors[r, c] = lane % 8
    title = title or f"{layout.name}: {layout.rows}x{layout.cols}, {layout.elem_bits}-bit, T = lane, R = register" \
                     + (" . element" if layout.elems_per_reg > 1 else "")
    _render(path, title, labels, colors)
    return LayoutPicture(Path(path), "fragment", title, labels, colors)


def draw_matrix_move(layout: MatrixMoveLayout, path, op: str = "ldmatrix", title: str | None = None) -> LayoutPicture:
    """The ``num`` 8x8 b16 matrices of ldmatrix / stmatrix: lane and register half of every element, and the lane that
    gives each row's address."""
    if op not in ("ldmatrix", "stmatrix"):
        raise UnsupportedConfigError(f"op must be 'ldmatrix' or 'stmatrix', not {op!r}")
    cols = 8 * layout.num
    labels = np.empty((8, cols), dtype=object)
    colors = np.zeros((8, cols), dtype=np.int64)
    for m in range(layout.num):
        for r in range(8):
            for c in range(8):
                lane, reg, half = layout.inverse(m, r, c)
                labels[r, 8 * m + c] = f"T{lane}\nR{reg}.{half}"
                colors[r, 8 * m + c] = lane % 8
    row_names = [" ".join(f"T{layout.lane_of_address(m, r)}" for m in range(layout.num)) + f" > {r}"
                 for r in range(8)]
    col_names = [f"m{m}.{c}" for m in range(layout.num) for c in range(8)]
    flow = "receives" if op == "ldmatrix" else "supplies"
    title = title or (f"{layout.ptx(op)}: lane T / register R.half that {flow} each b16 element; "
                      f"row labels: lanes giving the row addresses")
    _render(path, title, labels, colors, row_names=row_names, col_names=col_names,
            separators=[8 * m for m in range(1, layout.num)])
    return LayoutPicture(Path(path), op, title, labels, colors)


def draw_swizzle(layout: SwizzleLayout, path, rows: int | None = None, title: str | None = None) -> LayoutPicture:
    """Logical 16-byte chunks of the first 2-D tile (``rows`` of them, default up to 16), labelled with their
    physical chunk and coloured by bank group."""
    nrows = min(layout.rows, rows or 16)
    ncols = layout.chunks_per_row
    lead = (0,) * len(layout.leading_shape)
    labels = np.empty((nrows, ncols), dtype=object)
    colors = np.zeros((nrows, ncols), dtype=np.int64)
    for r in range(nrows):
        for k in range(ncols):
            phys = layout(*lead, r, k * layout.elems_per_chunk)
            pk = int(phys[-1]) // layout.elems_per_chunk
            addr = int(layout.byte_offset(*lead, r, k * layout.elems_per_chunk))
            labels[r, k] = f"->{pk}"
            colors[r, k] = (addr // CHUNK_BYTES) % 8
    conflicts = layout.ldmatrix_conflicts()
    title = title or (f"{layout.describe()}\n{layout.dtype}{list(layout.shape)}: logical 16-B chunk (row, k) -> "
                      f"physical chunk; colour = bank group (banks 4g..4g+3); ldmatrix conflicts {conflicts}")
    footer = "bank groups: " + "  ".join(f"{g}: banks {4 * g}-{4 * g + 3}" for g in range(8))
    _render(path, title, labels, colors, col_names=[f"k{k}" for k in range(ncols)], footer=footer)
    return LayoutPicture(Path(path), "swizzle", title, labels, colors)


def draw_raster(order: RasterOrder, path, wave: int = 8, title: str | None = None) -> LayoutPicture:
    """The pid computing each tile of the grid, coloured by wave (``wave`` consecutive pids)."""
    pids = order.order()
    labels = np.vectorize(str, otypes=[object])(pids)
    colors = pids // max(1, wave) % 8
    title = title or f"{order!r}: pid of each C tile (colour: waves of {wave} CTAs)"
    _render(path, title, labels, colors)
    return LayoutPicture(Path(path), "raster", title, labels, colors)


def draw_layout(layout, path, **kw) -> LayoutPicture:
    """Dispatch on the layout object's type (FragmentLayout, MatrixMoveLayout, SwizzleLayout, RasterOrder)."""
    if isinstance(layout, FragmentLayout):
        return draw_fragment(layout, path, **kw)
    if isinstance(layout, MatrixMoveLayout):
        return draw_matrix_move(layout, path, **kw)
    if isinstance(layout, SwizzleLayout):
        return draw_swizzle(layout, path, **kw)
    if isinstance(layout, RasterOrder):
        return draw_raster(layout, path, **kw)
    raise UnsupportedConfigError(f"no picture for a {type(layout).__name__}; drawable: FragmentLayout, "
                                 f"MatrixMoveLayout, SwizzleLayout, RasterOrder")
