"""The serving model: arrivals, the batcher's event loop on either clock, request logs, the simulator."""
