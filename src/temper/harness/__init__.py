"""Harness optimisation (Meta-Harness style): a harness file, the env it wraps, the proposers and
the outer search loop the `harness_search` stage runs (`temper.stages.harness_search`)."""
