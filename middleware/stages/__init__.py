"""The pipeline's stages, one module each: every stage a class with `__call__(exchange,
call_next)`, put in order by `middleware.pipeline.default_pipeline`."""
