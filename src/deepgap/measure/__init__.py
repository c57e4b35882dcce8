"""What a worker process runs to measure: models, engines, quantization, timing and telemetry.

Only the worker (`deepgap.measure.worker`) and the features' worker-side handlers import the GPU code here;
the parent imports the light modules (registries, settings) to plan and validate.
"""
