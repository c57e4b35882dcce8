"""Serving scenarios: single-stream, offline and server (dynamic batching under live traffic).

The paper measured closed-loop batches; a deployment sees queries arrive on their own schedule. This
package holds one dynamic batcher (`batcher`) and one event loop that both the real server
(`server`, a wall clock and a real engine) and the discrete-event simulator (`sim`, a virtual clock
and a service-time curve from a batch sweep) run, so a predicted capacity and a measured one differ
only in the clock and the executor. `capacity` searches the highest arrival rate whose p99 stays
within an SLO with a statistical stop rule (MLPerf LoadGen's early-stopping idea); `planner` turns
capacities into a device count and power per device kind. Nothing here imports torch at module
scope: the CLI stays fast and the parent process never touches the GPU.
"""

from deepgap.serving.batcher import BatchPolicy
from deepgap.serving.clock import RealClock, VirtualClock

__all__ = ["BatchPolicy", "RealClock", "VirtualClock"]
