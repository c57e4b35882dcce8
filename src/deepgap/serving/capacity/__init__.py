"""Capacity at an SLO: the search over arrival rates, the plan from stored curves, the batch grid's limit."""
