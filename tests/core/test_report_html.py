"""report.html is HTML a browser renders: tables as tables, figures embedded (checked in headless Chromium)."""

from __future__ import annotations

from html.parser import HTMLParser

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from toolchain.report import _html

MD = """# r: Hydra results

## Results (test split, OOD test split)

| variant | accuracy | nll | auroc_msp |
|---|---:|---:|---:|
| single | 0.7380 | 0.6540 | 0.7210 |
| hydra | 0.7660 | 0.6049 | 0.7230 |

Text with <script>alert(1)</script> stays text.

## Figures

![reliability](../evaluate/reliability.png)
"""


class Tables(HTMLParser):
    """Collects the cell texts of every table, the image sources and the script tags."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.images: list[str] = []
        self.scripts = 0
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "img":
            self.images.append(dict(attrs)["src"])
        elif tag == "script":
            self.scripts += 1

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def test_report_html_renders_its_tables_and_figures_in_a_browser(tmp_path, browser_dom):
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [0, 1])
    png = tmp_path / "reliability.png"
    fig.savefig(png)
    plt.close(fig)
    page = tmp_path / "report.html"
    page.write_text(_html("r", MD, [png]))
    dom = Tables()
    dom.feed(browser_dom(page))
    assert dom.tables, "no <table> in the rendered page"
    header, *rows = dom.tables[0]
    assert header == ["variant", "accuracy", "nll", "auroc_msp"]
    assert ["hydra", "0.7660", "0.6049", "0.7230"] in rows
    assert len(dom.images) == 1 and dom.images[0].startswith("data:image/png;base64,")
    assert dom.scripts == 0  # Markdown text is escaped, never run
