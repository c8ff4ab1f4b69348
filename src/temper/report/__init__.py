"""An HTML report of a run folder: the page a user opens after a run instead of reading logs.

Everything is read back from what the stages left on disk (stage.json, metrics.jsonl, the stage
summaries, eval.json), so the report can be rebuilt for any run, finished or not. The sections
live here, one module each (training, evaluation, rl, ...), entered by stage kind in `sections`
(the report looks kinds up in `temper.stages.registry`; the stages never import the report), with
the shared helpers in `common` and the page around them in `page`. Plots are PNG files under plots/ and are also inlined as data URIs, so
report.html is one portable file with no scripts and no network.

Plots use `matplotlib.figure.Figure` directly rather than pyplot: it renders with Agg without
`matplotlib.use`, so importing this module never switches the backend of the caller's process
(a notebook's, say), and figures need no `plt.close` to be freed.
"""

from typing import TYPE_CHECKING

from temper.lazy import exports

if TYPE_CHECKING:  # the names, for type checkers; imported on first use (temper.lazy)
    from temper.report.common import Stage, read_metrics
    from temper.report.evaluation import eval_table, highlights
    from temper.report.page import find_stages, write_report
    from temper.report.sections import section_for

__getattr__, __dir__ = exports(
    globals(),
    {
        "Stage": "common",
        "read_metrics": "common",
        "eval_table": "evaluation",
        "highlights": "evaluation",
        "find_stages": "page",
        "write_report": "page",
        "section_for": "sections",
    },
)

__all__ = ["Stage", "eval_table", "find_stages", "highlights", "read_metrics", "section_for", "write_report"]
