"""What every Pointsman test suite shares: tiny pod and snapshot builders, and waiting for a condition.

Test code only: no service imports it.
"""

from pointsman_testkit.pods import NOW, every_field_set, pod, pool_pods, snapshot
from pointsman_testkit.waiting import eventually

__all__ = ["NOW", "eventually", "every_field_set", "pod", "pool_pods", "snapshot"]
