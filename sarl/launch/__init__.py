"""What `sarl.train` does above the back ends: composing a run's config (`compose`), stage pipelines (`pipeline`),
the format preflight (`format_preflight`)."""
