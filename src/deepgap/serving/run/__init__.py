"""A serve run in the parent: its spec, prelude, drivers (scenarios, tenants) and the worker it talks to."""
