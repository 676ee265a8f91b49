"""The scheduling core: pure functions of a request, the pods and an injected ``random.Random``.

No gRPC, Redis, HTTP or clock in here (a test enforces it). The plugins' contracts are in
:mod:`~pointsman_picker.scheduling.contracts`; the plugins by kind in ``filters``, ``scorers`` and
``pickers``; the registry of their types in ``plugins``; trees of filters in ``tree``, profiles in
``profiles``, and the pods' facts in ``facts`` (plain) and ``indexed``.
"""

from pointsman_picker.scheduling.contracts import Filter, Picker, PodFacts, Scorer
from pointsman_picker.scheduling.scheduler import Scheduler
from pointsman_picker.scheduling.tree import Node, StepSink, build_tree, run_tree
from pointsman_picker.scheduling.types import Drop, Pods, SchedulingRequest

__all__ = [
    "Drop",
    "Filter",
    "Node",
    "Picker",
    "PodFacts",
    "Pods",
    "Scheduler",
    "SchedulingRequest",
    "Scorer",
    "StepSink",
    "build_tree",
    "run_tree",
]
