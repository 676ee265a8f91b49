"""The scheduling core: pure functions of a request, the pods and an injected ``random.Random``.

No gRPC, Redis, HTTP or clock in here (a test enforces it).
"""

from pointsman_picker.scheduling.filters import Drop, FilterFn, Node, StepSink, run_tree
from pointsman_picker.scheduling.scheduler import Scheduler
from pointsman_picker.scheduling.tree import build_tree
from pointsman_picker.scheduling.types import NoCapacity, Pods, SchedulingRequest

__all__ = [
    "Drop",
    "FilterFn",
    "NoCapacity",
    "Node",
    "Pods",
    "Scheduler",
    "SchedulingRequest",
    "StepSink",
    "build_tree",
    "run_tree",
]
