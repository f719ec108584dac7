"""Side-by-side HTML of control and candidate answers, for the human spot check of an A/B.

Metrics say how much the outputs moved, not whether the new ones are worse; a person reading fifty
pairs does. The page is one self-contained file (inline CSS, no scripts) so it opens from an MLflow
artifact or an email attachment alike.
"""
from __future__ import annotations

import html
from pathlib import Path

from optladder.quality.item import PromptItem

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; }
table { border-collapse: collapse; width: 100%; table-layout: fixed; }
th, td { border: 1px solid #ccc; padding: .4em; vertical-align: top; text-align: left; }
td { white-space: pre-wrap; word-wrap: break-word; font-size: .9em; }
th { background: #f0f0f0; }
tr.differ td.mark { background: #ffd7d7; font-weight: bold; }
td.mark, th.mark { width: 4em; text-align: center; }
td.id, th.id { width: 9em; }
ul { margin: 0; padding-left: 1.2em; }
"""


def write_review_html(
    path: str | Path,
    items: list[PromptItem],
    control_outputs: list[str],
    candidate_outputs: list[str],
    n: int = 50,
    title: str = "optladder review: control vs candidate",
    differing_first: bool = True,
) -> Path:
    """Write `n` prompts with their reference, control and candidate outputs; return the path.

    With `differing_first`, prompts whose two outputs differ come first (in prompt order), since those
    are the ones a reviewer has to judge; identical pairs fill the rest of the `n` rows.
    """
    if not len(items) == len(control_outputs) == len(candidate_outputs):
        raise ValueError(f"{len(items)} prompts, {len(control_outputs)} control outputs and "
                         f"{len(candidate_outputs)} candidate outputs; they must pair one to one")
    if n < 1:
        raise ValueError(f"review n must be >= 1, got {n}")
    rows = list(zip(items, control_outputs, candidate_outputs))
    n_differ = sum(ctl != cand for _, ctl, cand in rows)
    if differing_first:
        # sorted() is stable, so each group keeps prompt order
        rows = sorted(rows, key=lambda r: r[1] == r[2])
    body = "\n".join(_row(item, ctl, cand) for item, ctl, cand in rows[:n])
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_CSS}</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p>{min(n, len(rows))} of {len(rows)} prompts shown; the outputs differ on {n_differ} of {len(rows)}
({"differing prompts first" if differing_first else "prompt order"}). &#x2260; marks a difference.</p>
<table>
<thead><tr><th class="id">id</th><th>prompt</th><th>reference</th><th>control</th><th>candidate</th>
<th class="mark">differ</th></tr></thead>
<tbody>
{body}
</tbody></table>
</body></html>
"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


def _row(item: PromptItem, control: str, candidate: str) -> str:
    differ = control != candidate
    refs = "".join(f"<li>{html.escape(r)}</li>" for r in item.references)
    cells = [
        f'<td class="id">{html.escape(item.id)}</td>',
        f"<td>{html.escape(item.prompt)}</td>",
        f"<td><ul>{refs}</ul></td>",
        f"<td>{html.escape(control)}</td>",
        f"<td>{html.escape(candidate)}</td>",
        f'<td class="mark">{"&#x2260;" if differ else ""}</td>',
    ]
    return f'<tr class="{"differ" if differ else "same"}">{"".join(cells)}</tr>'
