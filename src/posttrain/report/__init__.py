"""Run reports: a self-contained HTML page of a run's curves, held-out tables, probes and alarms.

Invariant: a report is a pure function of the run directory's files; the
package imports matplotlib only when a report is written.
"""

from posttrain.report.html import write_report

__all__ = ["write_report"]
