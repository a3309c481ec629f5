"""The HTML page shell both pages of the pack share: the pack page
(:mod:`capacity_pack.decide.html`) and ``capacity-pack compare --html``
(:mod:`capacity_pack.decide.compare_render`).

One self-contained file: doctype, ``lang="en"``, UTF-8, a viewport, the title, inline CSS
(:data:`BASE_CSS`, then the page's own), the body in one ``<main>``; no script, nothing fetched.
Every text the pack did not write itself goes through :func:`escape`.
"""

from __future__ import annotations

import html
from typing import Any

#: The rules both pages share: the type, the width of the column, tables and code.
BASE_CSS = """
:root { --ink:#1d2330; --muted:#5b6475; --line:#d9dde5; --bg:#fbfcfd; --accent:#1f5fbf; }
* { box-sizing: border-box; }
body { margin:0; font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
  color:var(--ink); background:var(--bg); }
main { max-width:1180px; margin:0 auto; padding:1.2rem 1.6rem 4rem; }
h1 { font-size:1.55rem; margin:.2rem 0 .6rem; }
h2 { font-size:1.25rem; margin:2.2rem 0 .6rem; padding-top:.4rem;
  border-top:1px solid var(--line); }
h3 { font-size:1.05rem; margin:1.4rem 0 .4rem; }
a { color:var(--accent); }
table { border-collapse:collapse; margin:.5rem 0 1rem; font-size:.88rem; }
th, td { border:1px solid var(--line); padding:.25rem .5rem; text-align:left; vertical-align:top; }
th { background:#f0f2f6; font-weight:600; }
code { font-size:.9em; background:#f0f2f6; padding:0 .2rem; border-radius:2px; }
"""


def escape(value: Any) -> str:
    """``value`` as HTML text, quotes escaped too (safe in an attribute)."""
    return html.escape(str(value), quote=True)


def page(title: str, body: str, css: str = "") -> str:
    """The whole page: the shell around ``body`` (HTML), titled ``title`` (plain text, escaped
    here), styled by :data:`BASE_CSS` and then ``css``."""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n<style>{BASE_CSS}{css}</style>\n</head>\n"
        f"<body>\n<main>\n{body}\n</main>\n</body>\n</html>\n"
    )
