"""Serving rows in a store: a serve run's levels, curves and capacities, and their typed details."""
