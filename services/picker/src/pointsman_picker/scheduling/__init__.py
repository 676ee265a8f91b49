"""The scheduling core: pure functions of a request, the pods, the request's cycle state and an injected
``random.Random``; and the request plugins whose state outlives a request.

No gRPC, Redis, HTTP or clock in here (a test enforces it). The plugins' contracts are in
:mod:`~pointsman_picker.scheduling.contracts`; the plugins by kind in ``filters``, ``scorers``,
``pickers`` and the request plugins' own modules (``assignments``, ``backlog``, ``recent_targets``);
the registry of their types in ``registry``; trees of filters in ``tree``, profiles in ``profiles``,
their lifecycle in ``lifecycle``, and the pods' facts in ``facts`` (plain) and ``indexed``.
"""

from pointsman_picker.scheduling.contracts import Filter, Picker, PodFacts, RequestPlugin, Scorer, Ticket
from pointsman_picker.scheduling.tree import Node, StepSink, build_tree, run_tree
from pointsman_picker.scheduling.types import CycleState, DataKey, Drop, Pods, SchedulingRequest

__all__ = [
    "CycleState",
    "DataKey",
    "Drop",
    "Filter",
    "Node",
    "Picker",
    "PodFacts",
    "Pods",
    "RequestPlugin",
    "SchedulingRequest",
    "Scorer",
    "StepSink",
    "Ticket",
    "build_tree",
    "run_tree",
]
