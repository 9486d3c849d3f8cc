"""Run reports: a self-contained HTML page of a run's curves, samples, held-out tables, probes and
alarms (or of several runs overlaid), rewritten while the run trains.

Invariant: a report is a pure function of the run directory's files (and, for an image
task's sample, of its image family's code: the image is drawn again from the task id and shown
only when its digest is the recorded one, report/taskimages.py); the package imports matplotlib
only when a report is written.
"""

from posttrain.report.html import write_report
from posttrain.report.live import LiveReport

__all__ = ["LiveReport", "write_report"]
